"""Valid values of the config's choice fields and the per-field checks every section's ``__post_init__`` uses.

The names of each algorithm choice live here, at the bottom of the import order; the modules
that implement them (``repro.rl.algorithms``, ``advantages``, ``policy_losses``) import them.
"""

from __future__ import annotations

import ast
import inspect
from typing import Any

ZERO_STAGES = (1, 2, 3)


OFFLOAD_CHOICES = ("none", "cpu", "nvme", "auto")


MODEL_DTYPES = ("auto", "bfloat16", "float32")


# The valid names of each algorithm choice live here, at the bottom of the import order, and the
# modules that implement them (repro.rl.algorithms, advantages, policy_losses) import them.
ADV_ESTIMATORS = ("gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo", "gpg",
                  "grpo_passk", "remax")


LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "token-sum", "seq-mean-token-sum-norm")


_KL_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


# "<kind>+": the value of <kind>, the gradient of k2 (straight-through; verl's unbiased KL gradient).
KL_LOSS_TYPES = _KL_KINDS + tuple(k + "+" for k in _KL_KINDS)


WARMUP_STYLES = ("constant", "cosine", "linear")


ROLLOUT_NAMES = ("hf", "vllm")
COMPILE_LAYERS = ("off", "inductor", "aot_eager")
"""``model.compile_layers``: off, or the torch.compile backend of every decoder layer (aot_eager: traced, torch's kernels)."""
COMPILE_SCOPES = ("layer", "stack")
"""``model.compile_scope``: each decoder layer its own compiled region, or the model's whole decoder stack one region."""
FLASH_ATTENTION = ("torch", "fa4")
"""``model.flash_attention``: the kernels behind torch's flash ops on CUDA (repro.workers.varlen.FLASH_IMPLS)."""
GRADIENT_CHECKPOINTING = (True, False, "auto")
"""``model.enable_gradient_checkpointing``: on, off, or decided from the free memory at the first update."""


REWARD_KWARGS = ("method", "format_score", "score")


GSM8K_METHODS = ("strict", "flexible")


DEVICES = ("auto", "cpu", "cuda")


class ConfigFieldError(ValueError):
    """A bad value in one config section, named relative to that section.

    Sections are reused (``DeepSpeedConfig`` sits under the actor, the critic and the reference
    policy), so ``__post_init__`` cannot know its full key; ``repro.config.loader`` finds the
    section's path and re-raises with the full key (``actor_rollout_ref.actor.deepspeed.zero_stage``).
    Raised directly, the message names the class instead (``DeepSpeedConfig.zero_stage``).
    """

    def __init__(self, section: str, field_name: str, value: Any, detail: str) -> None:
        self.section = section
        self.field_name = field_name
        self.value = value
        self.detail = detail
        super().__init__(self.at(section))

    def at(self, path: str) -> str:
        """The message with the section's full path in front of the field name."""
        return f"{path}.{self.field_name}={self.value!r} {self.detail}"


def _fail(obj: Any, name: str, detail: str, value: Any = None) -> None:
    value = getattr(obj, name) if value is None and "." not in name else value
    raise ConfigFieldError(type(obj).__name__, name, value, detail)


def _choice(obj: Any, name: str, choices: tuple, value: Any = None) -> None:
    value = getattr(obj, name) if value is None else value
    if value not in choices:
        _fail(obj, name, f"is not valid; choose one of {list(choices)}", value)


def _positive(obj: Any, name: str, allow_none: bool = False) -> None:
    value = getattr(obj, name)
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        _fail(obj, name, "must be a positive number", value)


def revalidate(section: Any) -> None:
    """Run a config section's own checks again (its ``__post_init__``, the one place its keys are
    validated). The DeepSpeed boundary (``repro.config.ds_config``) calls it, so a section edited
    after it was built is refused there with the message it would have got when built."""
    section.__post_init__()


def check_sp_size(section: Any) -> None:
    """``ulysses_sequence_parallel_size`` of any section that has one (the actor, the critic, verl's
    DeepSpeed engine section): an integer >= 1. Whether it divides the world is the batch plan's
    rule (``repro.batching.plan.data_parallel_size``), and one size for every role the run config's
    (``repro.config.rules.validate_run_config``)."""
    value = section.ulysses_sequence_parallel_size
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        _fail(section, "ulysses_sequence_parallel_size", "must be an integer >= 1")


def _check_trainer_role(role: Any) -> None:
    """The checks the actor and the critic share: backend, batch sizes, loss reduction, SP size."""
    if role.strategy != "deepspeed":
        _fail(role, "strategy", "is not supported here; choose one of ['deepspeed']")
    _positive(role, "ppo_mini_batch_size")
    _positive(role, "ppo_micro_batch_size_per_gpu", allow_none=True)
    _positive(role, "ppo_micro_batch_size", allow_none=True)
    _positive(role, "ppo_max_token_len_per_gpu")
    _positive(role, "ppo_epochs")
    _choice(role, "loss_agg_mode", LOSS_AGG_MODES)
    _positive(role, "loss_scale_factor", allow_none=True)
    check_sp_size(role)


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls`` (and of its dataclass bases), read from
    the source: ``{name: cleaned text}``, a field without one left out. Subclasses win."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if "__dataclass_fields__" not in vars(klass):
            continue
        try:
            tree = ast.parse(inspect.getsource(klass))
        except (OSError, TypeError):  # no source (a class built at run time)
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for stmt, nxt in zip(body, body[1:], strict=False):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


POLICY_LOSS_MODES = ("vanilla", "gspo", "gpg", "cispo", "geo_mean", "clip_cov", "kl_cov")

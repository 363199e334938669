"""SFT warm start of a built-in policy on the arithmetic task, cached on disk by recipe.

Two recipes are named in ``repro.data.policies``: the tiny policy (1 M parameters, on CPU) and the
Qwen3-0.6B-shaped one (on a GPU, bf16; it differs in shape, batch, learning rate, warm-up and dtype).

A freshly initialised tiny Qwen3 scores ~0 on the task, which gives GRPO nothing to reinforce; trained to
convergence it scores ~1, which leaves no room to improve. Accuracy under SFT jumps suddenly at a
seed-dependent step, so a fixed step count lands anywhere from ~0 to ~0.85. Instead training stops the first
time held-out greedy accuracy (checked every ``eval_every`` steps) reaches ``threshold`` (measured with recipe
version 1: 0.26-0.41 over five seeds for threshold 0.25; version 2, seed 0: 0.28 after 240 steps).

SFT trains on the ``train`` region and stops on its own held-out set (``sft_val``); the RL validation set
(``rl_val``) is disjoint from both (``repro.data.arith``). Plain PyTorch, deterministic from the seed on one
machine (not across CPU models: the default tiny recipe's policy is therefore shipped,
``repro.data.tiny_fixture``, and copied instead of trained). The result is a Hugging Face model folder
(weights, config, tokenizer, ``repro_tiny_policy.json`` with the figures) under ``$REPRO_CACHE_DIR`` (default
``~/.cache/repro``) in ``<folder>/<hash of recipe and of the torch and transformers versions>``, so a second
call returns at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from repro.data import arith, tiny_fixture
from repro.data.tiny_model import PolicyShape, build_model, num_parameters, save_model, tiny_config
from repro.data.tokenizer import build_tokenizer
from repro.devices import default_device
from repro.rewards.gsm8k import compute_score

# Bump when the training procedure changes, so old cache entries are not reused.
RECIPE_VERSION = 2
REPORT_NAME = "repro_tiny_policy.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Recipe fields added after version 2, with the value every earlier build used (SFTRecipe.as_dict).
_ADDED_LATER: dict[str, Any] = {"warmup_steps": 0, "betas": (0.9, 0.999), "weight_decay": 0.01, "dtype": "float32"}

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SFTRecipe:
    """Everything that determines the warm-started tiny policy."""

    seed: int = 0
    """Seed for weight init and batch sampling."""
    data_seed: int = 0
    """Seed of the held-out draw from the ``sft_val`` region (disjoint from RL validation)."""
    digits: tuple[int, ...] = arith.DEFAULT_DIGITS
    """Digits per operand of the task (difficulty knob)."""
    n_val: int = 200
    """Held-out problems for the accuracy check."""
    batch_size: int = 64
    """Sequences per SFT step."""
    lr: float = 1e-3
    """AdamW learning rate."""
    threshold: float = 0.25
    """Stop as soon as held-out greedy accuracy reaches this."""
    eval_every: int = 10
    """Steps between accuracy checks."""
    max_steps: int = 3000
    """Give up (RuntimeError) if the threshold is not reached by then."""
    grad_clip: float = 1.0
    """Gradient-norm clip."""
    shape: PolicyShape = field(default_factory=PolicyShape)
    """Model size."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up (the 0.6B policy diverges at 3e-4 without one)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    weight_decay: float = 0.01
    """AdamW weight decay (torch's default)."""
    dtype: str = "float32"
    """Parameter dtype of the build: ``float32`` or ``bfloat16`` (pure bf16 weights and AdamW state,
    the 0.6B recipe: its fp32 Adam state would be 7 GB for a build of a minute)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "digits", arith.validate_digits(self.digits))
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"SFTRecipe.threshold={self.threshold} must be in (0, 1]")
        for name in ("n_val", "batch_size", "eval_every", "max_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"SFTRecipe.{name}={getattr(self, name)} must be >= 1")
        room = arith.region_size(self.digits, "sft_val")
        if self.n_val > room:
            raise ValueError(f"SFTRecipe.n_val={self.n_val} is more than the {room} SFT held-out problems "
                             f"for digits={self.digits}")
        if self.lr <= 0 or self.grad_clip <= 0:
            raise ValueError(f"SFTRecipe.lr={self.lr} and grad_clip={self.grad_clip} must be > 0")
        if self.warmup_steps < 0 or self.weight_decay < 0:
            raise ValueError(f"SFTRecipe.warmup_steps={self.warmup_steps} and weight_decay={self.weight_decay} "
                             "must be >= 0")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        if self.dtype not in DTYPES:
            raise ValueError(f"SFTRecipe.dtype={self.dtype!r} is not one of {sorted(DTYPES)}")

    def as_dict(self) -> dict[str, Any]:
        """The recipe as the cache key and the build report record it.

        Fields added after recipe version 2 (``_ADDED_LATER``) and shape fields left at None enter
        only when set, so the tiny policy keeps its key: every cached copy and the committed
        reports stay valid, and a recipe that sets them gets a key of its own.
        """
        d = dataclasses.asdict(self)
        d["shape"] = {k: v for k, v in d["shape"].items() if v is not None}
        return {k: v for k, v in d.items() if k not in _ADDED_LATER or _ADDED_LATER[k] != v}

    def key(self, device_type: str) -> str:
        """Hash of the recipe, the code version, the device type and the library versions.

        The same recipe gives bitwise-equal weights on one machine, but other torch or
        transformers releases (kernels, initialisation order) give other weights and another
        SFT stopping step, so each release pair gets its own cache entry.
        """
        blob = json.dumps(
            {"recipe": self.as_dict(), "version": RECIPE_VERSION, "device": device_type,
             "libraries": library_versions()},
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def library_versions() -> dict[str, str]:
    """The versions that change the tiny policy's weights."""
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


def sft_held_out(recipe: SFTRecipe) -> list[arith.Problem]:
    """The problems SFT stops on: its own, from the arithmetic task's ``sft_val`` region."""
    rng = random.Random(f"repro.sft.held_out:{recipe.data_seed}:{','.join(map(str, recipe.digits))}")
    return arith.unique_in(rng, recipe.digits, "sft_val", recipe.n_val, "SFTRecipe.n_val")


def sft_training_sampler(recipe: SFTRecipe) -> Callable[[], arith.Problem]:
    """The i.i.d. stream of SFT training problems (the ``train`` region), the same on every call."""
    rng = random.Random(f"repro.sft:{recipe.seed}")
    return lambda: arith.draw_in(rng, recipe.digits, "train")


# Accuracy band the default recipe is meant to land in (threshold 0.25 plus the overshoot of a
# 10-step check interval measured over five seeds); RL has room above it.
ACCURACY_BAND = (0.25, 0.60)


def cache_root() -> Path:
    """``$REPRO_CACHE_DIR`` or ``~/.cache/repro``."""
    return Path(os.environ.get("REPRO_CACHE_DIR") or Path.home() / ".cache" / "repro")


@functools.lru_cache(maxsize=4096)  # a build encodes its few hundred problems ~35k times (~5 of its ~70 CPU s)
def _encode(tok: Any, text: str) -> list[int]:  # shared: callers copy, never change it
    return tok(text, add_special_tokens=False)["input_ids"]


def _sft_batch(tok: Any, problems: Sequence[arith.Problem], device: torch.device) -> tuple[torch.Tensor, ...]:
    """Right-padded ids, attention mask and labels; loss only on the answer and its EOS."""
    seqs, labels = [], []
    for p in problems:
        prompt = _encode(tok, arith.question(p))
        target = _encode(tok, arith.answer(p)) + [tok.eos_token_id]
        seqs.append(prompt + target)
        labels.append([-100] * len(prompt) + target)
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    lab = torch.full_like(ids, -100)
    for i, (s, y) in enumerate(zip(seqs, labels, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
        lab[i, : len(y)] = torch.tensor(y)
    return ids.to(device), mask.to(device), lab.to(device)


@torch.no_grad()
def greedy_completions(model: torch.nn.Module, tok: Any, prompts: Sequence[str], max_new_tokens: int,
                       device: torch.device) -> list[str]:
    """Greedy continuations of each prompt up to EOS, decoded without special tokens.

    Prompts are grouped by token length so no padding is needed (the arithmetic prompts of one
    digit setting all have the same length).
    """
    was_training = model.training
    model.eval()
    encoded = [_encode(tok, p) for p in prompts]
    out: list[str] = [""] * len(prompts)
    by_len: dict[int, list[int]] = {}
    for i, e in enumerate(encoded):
        by_len.setdefault(len(e), []).append(i)
    for idx in by_len.values():
        ids = torch.tensor([encoded[i] for i in idx], device=device)
        start = ids.shape[1]
        done = torch.zeros(len(idx), dtype=torch.bool, device=device)
        step_in, past = ids, None
        for _ in range(max_new_tokens):
            res = model(input_ids=step_in, past_key_values=past, use_cache=True)
            past = res.past_key_values
            nxt = res.logits[:, -1].argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, tok.eos_token_id), nxt)
            ids = torch.cat([ids, nxt[:, None]], dim=1)
            step_in = nxt[:, None]
            done |= nxt == tok.eos_token_id
            if bool(done.all()):
                break
        for row, i in enumerate(idx):
            gen = ids[row, start:].tolist()
            if tok.eos_token_id in gen:
                gen = gen[: gen.index(tok.eos_token_id)]
            out[i] = tok.decode(gen, skip_special_tokens=True)
    model.train(was_training)
    return out


def greedy_accuracy(model: torch.nn.Module, tok: Any, problems: Sequence[arith.Problem],
                    device: torch.device) -> float:
    """Share of problems whose greedy completion gets strict GSM8K reward 1."""
    longest = max(len(arith.answer(p)) for p in problems)
    texts = greedy_completions(model, tok, [arith.question(p) for p in problems], longest + 2, device)
    return sum(compute_score(t, str(sum(p))) == 1.0 for t, p in zip(texts, problems, strict=True)) / len(problems)


def train_tiny_policy(recipe: SFTRecipe, out_dir: str | os.PathLike[str],
                      device: torch.device | None = None) -> dict[str, Any]:
    """Build, warm-start and save the tiny policy into ``out_dir``; returns the report dict."""
    device = device or default_device()
    if device.type == "cpu":
        # One thread: results do not depend on the host's core count, and on a shared machine
        # a second contended thread costs more than it gains for a 1 M-parameter model.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return _train(recipe, Path(out_dir), device)
        finally:
            torch.set_num_threads(threads)
    return _train(recipe, Path(out_dir), device)


@contextlib.contextmanager
def _deterministic(device: torch.device) -> Iterator[None]:
    """Deterministic kernels for the build: on CPU an op without one fails instead of varying; on CUDA
    it only warns (one missing kernel deep in a library must not cost a GPU build; two 0.6B builds on two
    H100 machines matched at every check, ``results/seed_scale/README.md``). cuBLAS needs its workspace
    pinned before its first handle for reproducible GEMMs."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=device.type != "cpu")
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def _train(recipe: SFTRecipe, out: Path, device: torch.device) -> dict[str, Any]:
    with _deterministic(device):
        return _train_deterministic(recipe, out, device)


def _train_deterministic(recipe: SFTRecipe, out: Path, device: torch.device) -> dict[str, Any]:
    t0 = time.perf_counter()
    tok = build_tokenizer()
    config = tiny_config(len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, recipe.shape)
    if device.type == "cuda":
        # Eager attention: SDPA's fused CUDA backward kernels have no deterministic mode, and the
        # build's sequences are ~20 tokens. The saved folder says sdpa (below), as runs use.
        config._attn_implementation = "eager"
    # Initialised where it trains: 0.6B parameters take seconds to initialise on a CPU.
    model = build_model(config, seed=recipe.seed, dtype=DTYPES[recipe.dtype],
                        device=device if device.type == "cuda" else "cpu").to(device)
    held_out = sft_held_out(recipe)
    draw = sft_training_sampler(recipe)

    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=recipe.betas, weight_decay=recipe.weight_decay)
    history = [(0, greedy_accuracy(model, tok, held_out, device))]
    step, loss_value = 0, float("nan")
    model.train()
    while history[-1][1] < recipe.threshold:
        if step >= recipe.max_steps:
            raise RuntimeError(
                f"tiny-policy SFT did not reach accuracy {recipe.threshold} in {recipe.max_steps} steps "
                f"(last checks: {history[-3:]}); raise max_steps or change the seed"
            )
        if recipe.warmup_steps:
            for group in opt.param_groups:
                group["lr"] = recipe.lr * min(1.0, (step + 1) / recipe.warmup_steps)
        ids, mask, labels = _sft_batch(tok, [draw() for _ in range(recipe.batch_size)], device)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1),
                               ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        opt.step()
        step += 1
        loss_value = float(loss.detach())
        if step % recipe.eval_every == 0:
            history.append((step, greedy_accuracy(model, tok, held_out, device)))
            log.info("policy SFT step %d loss %.4f held-out accuracy %.3f (%.1f s)",
                     step, loss_value, history[-1][1], time.perf_counter() - t0)
    model.config._attn_implementation = "sdpa"
    save_model(model.to("cpu"), out)
    tok.save_pretrained(out)
    report = {
        "key": recipe.key(device.type),
        "recipe": recipe.as_dict(),
        "recipe_version": RECIPE_VERSION,
        "device": device.type,
        "libraries": library_versions(),
        "num_parameters": num_parameters(model),
        "sft_steps": step,
        "final_loss": loss_value,
        "accuracy_before": history[0][1],
        "accuracy_after": history[-1][1],
        "history": history,
        "build_seconds": round(time.perf_counter() - t0, 2),
    }
    (out / REPORT_NAME).write_text(json.dumps(report, indent=1) + "\n")
    return report


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive lock so parallel test workers build one cache entry once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_report(model_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The build report of a tiny-policy folder, or ``None`` if it is not one."""
    path = Path(model_dir) / REPORT_NAME
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def cached_policy_dir(recipe: SFTRecipe, device_type: str, folder: str = "tiny-policy") -> Path:
    """Where the build of ``recipe`` on ``device_type`` is cached (it may not exist yet)."""
    return cache_root() / folder / recipe.key(device_type)


def ensure_tiny_policy(out_dir: str | os.PathLike[str] | None = None, recipe: SFTRecipe | None = None,
                       device: torch.device | None = None, folder: str = "tiny-policy") -> Path:
    """Path of the warm-started policy of ``recipe`` (a normal ``model.path``), building it if not cached.

    With ``out_dir`` the cached folder is copied there (skipped if it already holds this recipe).
    ``folder`` names the cache folder (``repro.data.policies`` gives each built-in policy its own).
    """
    recipe = recipe or SFTRecipe()
    device = device or default_device()
    key = recipe.key(device.type)
    cached = cached_policy_dir(recipe, device.type, folder)
    if read_report(cached) is None:
        with _file_lock(cached.parent / f"{key}.lock"):
            if read_report(cached) is None:
                tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cached.parent))
                try:
                    if tiny_fixture.serves(recipe, device.type, folder):
                        tiny_fixture.materialize(tmp, key)  # shipped: the same policy on every machine
                    else:
                        train_tiny_policy(recipe, tmp, device)
                    shutil.rmtree(cached, ignore_errors=True)
                    os.replace(tmp, cached)
                except BaseException:
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise
    if out_dir is None:
        return cached
    out = Path(out_dir)
    existing = read_report(out)
    if existing is None or existing.get("key") != key:
        out.mkdir(parents=True, exist_ok=True)
        # The report goes last: its presence marks a complete copy.
        (out / REPORT_NAME).unlink(missing_ok=True)
        for item in sorted(cached.iterdir(), key=lambda p: p.name == REPORT_NAME):
            shutil.copy2(item, out / item.name)
    return out

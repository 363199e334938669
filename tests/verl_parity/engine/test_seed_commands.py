"""The seed DeepSpeed PR's command lines (``fixtures/pr_commands/``) composed by verl's own trainer config.

Each fixture is a verl user's ``python3 -m repro.main_ppo -cn ppo_trainer <overrides>``. Here its
overrides go to verl 0.9.1's ``ppo_trainer`` (what ``python -m verl.trainer.main_ppo`` composes) with
repro's yamls on the search path, and the composed config is read the way verl's trainer reads it:
``validate_config`` (``main_ppo.main``, before anything starts), ``need_critic`` /
``need_reference_policy`` for the roles, ``omega_conf_to_dataclass`` for the actor
(``ActorRolloutRefWorker``), ref (the same, after its renames) and critic (the v1 trainer's
``critic_cfg``), and ``EngineRegistry.get_engine_cls(model_type, backend=engine.strategy)`` for the
engine. The checks: repro's engine for each role, with the command's ZeRO stage and offload (and the
offload plan the engine will run, with the fixture's ``# env:`` knobs set).

What the test changes in a command, and why (docs/verl_engine.md, "The seed PR's command lines"):
- ``${DATA_TRAIN}``, ``${DATA_VAL}``, ``${BENCH_DIR}`` are shell variables the seed's caller sets: the
  test supplies paths (nothing reads them while composing).
- ``trainer.use_legacy_worker_impl=enable`` is dropped: verl 0.9.1 has no legacy workers (the key is
  gone from its config; its engine workers are the only ones, and they run repro's engine). Kept, it
  is refused at composition, naming the key.
- ``ref@actor_rollout_ref.ref=deepspeed_ref`` is added where a command sets the ref's ``deepspeed``
  keys (the bench case): the actor's and critic's group choices cannot move the ref, which verl's
  defaults list takes from ``model_engine`` (dp).
- Where a command leaves the micro-batch sizes to repro's trainer (its default: 8 per GPU for actor
  and critic, the actor's for old log-probs, the rollout's for the ref), the test passes repro's:
  verl has no default and refuses the config, naming the keys.
- The critic's ``model`` section is left out of the critic's build: verl's ``HFModelConfig`` would
  fetch ``Qwen/Qwen3-0.6B``'s config from the hub, which says nothing about the engine.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import pytest

from tests.verl_parity.engine.harness import SEARCHPATH, ref_as_verl_worker_builds_it

ROOT = pathlib.Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "fixtures" / "pr_commands"
SUPPLIED = {"${DATA_TRAIN}": "/nonexistent/train.parquet", "${DATA_VAL}": "/nonexistent/val.parquet",
            "${BENCH_DIR}": "/nonexistent/bench"}
LEGACY_WORKERS = "trainer.use_legacy_worker_impl=enable"
REF_GROUP = "ref@actor_rollout_ref.ref=deepspeed_ref"
# repro's trainer's micro-batch defaults (repro.config.roles: 8 for actor and critic; the old log-probs
# fall back to the actor's), which verl lacks.
REPRO_MICRO = {"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8, "critic.ppo_micro_batch_size_per_gpu": 8,
               "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 8}


@dataclass(frozen=True)
class Expect:
    """What verl's trainer must read from a command (critic_stage None: no critic is built)."""

    stage: int
    offload: str
    critic_stage: int | None
    critic_sp: int = 1
    ref: tuple[int, str] | None = None
    """(stage, offload) of the ref, where the command configures one."""


# Written out, not parsed from the fixtures: a key the aliases failed to forward would otherwise be
# read back as the same default on both sides. Each command offloads actor and critic alike.
EXPECT = {
    "zero1_no_offload": Expect(1, "none", 1),
    "zero1_cpu_offload": Expect(1, "cpu", 1),
    "zero2_no_offload": Expect(2, "none", 2),
    "zero2_cpu_offload": Expect(2, "cpu", 2),
    "zero3_no_offload": Expect(3, "none", 3),
    "zero3_cpu_offload": Expect(3, "cpu", 3),
    "bench_zero3_cpu_offload": Expect(3, "cpu", 3, ref=(3, "cpu")),
    "minimal_demo": Expect(2, "none", 2),
    "older_form_aliases": Expect(2, "none", 2),
    "older_form_sp2": Expect(2, "none", 2, critic_sp=2),
    "grpo_fix_60": Expect(2, "none", None),
}
SIX = [c for c in EXPECT if c.startswith("zero")]


def test_every_fixture_has_an_expectation() -> None:
    assert sorted(EXPECT) == sorted(p.stem for p in FIXTURES.glob("*.txt"))
    assert len(SIX) == 6


def seed_command(case: str) -> tuple[list[str], dict[str, str]]:
    """The fixture's overrides (shell variables filled from SUPPLIED) and its ``# env:`` variables."""
    overrides, env = [], {}
    for line in (FIXTURES / f"{case}.txt").read_text().splitlines():
        line = line.strip()
        if line.startswith("# env:"):
            env = dict(kv.split("=", 1) for kv in line[len("# env:"):].split())
        elif line and not line.startswith("#"):
            for var, value in SUPPLIED.items():
                line = line.replace(var, value)
            overrides.append(line)
    return overrides, env


def verl_command(case: str) -> list[str]:
    """The seed's overrides as verl 0.9.1's trainer takes them (the module doc lists each change)."""
    seed = seed_command(case)[0]
    out = [o for o in seed if o != LEGACY_WORKERS]
    if any(o.startswith("actor_rollout_ref.ref.deepspeed.") for o in seed):
        out.insert(0, REF_GROUP)
    out += [f"{key}={value}" for key, value in REPRO_MICRO.items() if not any(o.startswith(key + "=") for o in seed)]
    rollout = next(o for o in out if o.startswith("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="))
    if not any(o.startswith("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=") for o in seed):
        out.append(rollout.replace(".rollout.", ".ref.", 1))  # repro's ref falls back to the rollout's
    return out


def compose(overrides: list[str]):
    """verl's ``ppo_trainer`` as ``python -m verl.trainer.main_ppo <overrides>`` composes it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=[SEARCHPATH, *overrides])


@dataclass
class Roles:
    actor: object
    critic: object | None
    ref: object | None


def as_verl_reads(cfg) -> Roles:
    """The role configs verl's trainer builds from ``cfg``: critic and ref only where it needs them."""
    from omegaconf import open_dict
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    with open_dict(cfg.critic):  # see the module doc: the hub lookup of the critic's model
        cfg.critic.model = None
    use_critic, use_ref = need_critic(cfg), bool(need_reference_policy(cfg))
    validate_config(config=cfg, use_reference_policy=use_ref, use_critic=use_critic)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    ref = omega_conf_to_dataclass(ref_as_verl_worker_builds_it(cfg)) if use_ref else None
    critic = omega_conf_to_dataclass(cfg.critic) if use_critic else None
    return Roles(actor, critic, ref)


@pytest.fixture(scope="module")
def registry():
    """verl's engine registry with repro's plugin loaded (what ``import verl`` does when it is installed)."""
    from verl.workers.engine import EngineRegistry

    import repro.integrations.verl.plugin  # noqa: F401  (registers at import, as verl's loader does)

    return EngineRegistry


@pytest.mark.parametrize("case", list(EXPECT))
def test_seed_command_selects_repros_engine_with_its_stage_and_offload(case: str, registry, monkeypatch) -> None:
    from repro.integrations.verl.engine import DeepSpeedEngine, DeepSpeedValueEngine

    env = seed_command(case)[1]
    for name, value in env.items():  # the knobs the seed's caller exports (VERL_ENABLE_PARAM_OFFLOAD, ...)
        monkeypatch.setenv(name, value)
    want = EXPECT[case]
    roles = as_verl_reads(compose(verl_command(case)))

    def check_offload(engine) -> None:
        plan = engine.offload_plan()
        assert plan.optimizer == want.offload
        # ZeRO-3 moves the parameters too only under VERL_ENABLE_PARAM_OFFLOAD=1, which the seed's ZeRO-3
        # offload cases export: the same stage-aware rule as in repro's trainer.
        params = engine.zero_stage == 3 and engine.offload == "cpu" and env.get("VERL_ENABLE_PARAM_OFFLOAD") == "1"
        assert plan.param == ("cpu" if params else "none")
        assert engine.repro_deepspeed().fp32_grad_accum is (env.get("VERL_DS_ZERO2_FP32_ACCUM_PATCH") == "1")

    actor = roles.actor.engine
    assert registry.get_engine_cls("language_model", backend=actor.strategy) is DeepSpeedEngine
    assert (roles.actor.strategy, actor.zero_stage, actor.offload) == ("deepspeed", want.stage, want.offload)
    check_offload(actor)
    if want.critic_stage is None:
        assert roles.critic is None
    else:
        critic = roles.critic.engine
        assert registry.get_engine_cls("value_model", backend=critic.strategy) is DeepSpeedValueEngine
        assert (critic.zero_stage, critic.offload, critic.ulysses_sequence_parallel_size) == (
            want.critic_stage, want.offload, want.critic_sp)
        assert critic.offload_dir == actor.offload_dir  # the bench case's offload_dir, else unset on both
        check_offload(critic)
    assert roles.ref is None  # no seed command has a KL term, so verl builds no ref
    if want.ref is not None:
        # The bench command configures the ref all the same: built as verl's worker would with KL on.
        from verl.utils.config import omega_conf_to_dataclass

        ref = omega_conf_to_dataclass(ref_as_verl_worker_builds_it(compose(verl_command(case)))).engine
        assert registry.get_engine_cls("language_model", backend=ref.strategy) is DeepSpeedEngine
        assert (ref.zero_stage, ref.offload, ref.forward_only) == (*want.ref, True)


@pytest.mark.parametrize("case", SIX)
def test_the_seed_spelling_and_model_engine_deepspeed_give_the_same_engines(case: str) -> None:
    """The documented equivalent (model_engine=deepspeed, critic.deepspeed.*) reads back the same."""
    seed = as_verl_reads(compose(verl_command(case)))
    renamed = [o.replace("critic.deepspeed_config.", "critic.deepspeed.") for o in verl_command(case)
               if not o.startswith(("actor@", "critic=", "actor_rollout_ref.actor.strategy="))]
    equivalent = as_verl_reads(compose(["model_engine=deepspeed", *renamed]))
    assert seed.actor.engine == equivalent.actor.engine
    assert seed.critic.engine == equivalent.critic.engine


def test_the_legacy_worker_key_is_refused_naming_it() -> None:
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as err:
        compose(seed_command("zero2_no_offload")[0])
    assert str(err.value).splitlines()[0] == "Could not override 'trainer.use_legacy_worker_impl'."


def test_the_refs_deepspeed_keys_without_the_ref_group_are_refused_naming_them() -> None:
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as err:
        compose([o for o in verl_command("bench_zero3_cpu_offload") if o != REF_GROUP])
    assert str(err.value).splitlines()[0] == "Could not override 'actor_rollout_ref.ref.deepspeed.zero_stage'."


CRITIC = ["critic=ds_critic", "critic.enable=True", *(f"{k}={v}" for k, v in REPRO_MICRO.items())]


@pytest.mark.parametrize("overrides,message", [
    (["critic.deepspeed_config.zero_stage=3", "critic.deepspeed.zero_stage=1"],
     "critic.deepspeed_config.zero_stage=3 contradicts deepspeed.zero_stage=1 (the same key); set one of them"),
    (["critic.deepspeed_config.zero_stage=4"],
     "critic.deepspeed_config (the seed's name of critic.deepspeed): deepspeed.zero_stage=4 is not valid; choose one of"),
    (["critic.deepspeed_config.offload=nvme"], "deepspeed.offload=nvme needs deepspeed.zero_stage=3"),
])
def test_a_bad_seed_critic_key_is_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(Exception) as err:
        as_verl_reads(compose([*CRITIC, *overrides]))
    cause = err.value.__cause__ or err.value  # hydra's instantiate wraps the config's own error
    assert message in str(cause) and "\n" not in str(cause), str(err.value)


def test_the_seed_critic_key_and_verls_agree_when_both_are_set() -> None:
    roles = as_verl_reads(compose([*CRITIC, "critic.deepspeed_config.zero_stage=3", "critic.deepspeed.zero_stage=3",
                                   "critic.deepspeed_config.offload=cpu"]))
    assert (roles.critic.engine.zero_stage, roles.critic.engine.offload) == (3, "cpu")


def test_with_kl_the_seed_spelling_needs_the_ref_selected_too(registry) -> None:
    """``actor@...=ds_actor`` cannot move the ref (verl's defaults list picks it from model_engine): with a
    KL loss the ref is verl's dp_ref, whose strategy is copied from the actor, so verl would hand repro's
    engine FSDP's section. It is refused in one line naming the fix; with the fix it is repro's."""
    kl = [*verl_command("zero3_no_offload"), "actor_rollout_ref.actor.use_kl_loss=True",
          "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2"]
    ref = as_verl_reads(compose(kl)).ref
    engine_cls = registry.get_engine_cls("language_model", backend=ref.engine.strategy)
    with pytest.raises(ValueError, match=r"ref@actor_rollout_ref\.ref=deepspeed_ref") as err:
        engine_cls(None, ref.engine, None)
    assert "\n" not in str(err.value)
    fixed = as_verl_reads(compose([REF_GROUP, *kl])).ref
    assert (fixed.engine.zero_stage, fixed.engine.forward_only) == (3, True)  # the actor's stage, forward only


def test_the_seed_reward_kwargs_reach_repros_reward_through_verls_custom_reward_function() -> None:
    """``+reward.reward_kwargs.*`` (grpo_fix_60) composes in verl, but only verl's DAPO reward manager reads
    ``reward.reward_kwargs``: the default one calls ``get_custom_reward_fn``, which sees none of them. The
    documented equivalent names repro's reward and moves the kwargs under ``custom_reward_function``."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    from repro.integrations.verl.reward import compute_score

    seed = compose(verl_command("grpo_fix_60"))
    assert seed.reward.reward_kwargs.method == "flexible" and get_custom_reward_fn(seed) is None
    moved = [o.replace("+reward.reward_kwargs.", "+reward.custom_reward_function.reward_kwargs.")
             for o in verl_command("grpo_fix_60")]
    fn = get_custom_reward_fn(compose([*moved, "reward.custom_reward_function.path=pkg://repro.integrations.verl.reward"]))
    # "the answer is 27" has no "#### 27": the seed's flexible rule scores it, the strict default does not.
    assert fn("openai/gsm8k", "the answer is 27", "27") == 1.0
    assert compute_score("openai/gsm8k", "the answer is 27", "27") == 0.0
    assert fn("openai/gsm8k", "#### 28", "27") == 0.1  # the seed's format_score

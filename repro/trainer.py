"""The single-controller PPO / GRPO loop (docs/architecture.md, "One RL step, stage by stage").

The driver owns the data, the rewards, the advantages and the bookkeeping; the ranks (one
``HybridWorker`` each, hosted by ``repro.cluster.worker_group.WorkerGroup``) own the models. One step:

    prompts -> rollout (synced weights) -> rewards (driver) -> old log-probs -> ref log-probs
    (if KL) -> values (PPO) -> advantages (driver) -> update critic -> update actor
    -> metrics row (+ validation at test_freq, in the same row) -> checkpoint at save_freq

Reproducibility: the prompts of step ``s`` are a pure function of (``data.seed``, ``s``), and
each rank samples with a seed derived from (``trainer.seed``, ``s``, rank), so a run resumed from
a checkpoint at step ``k`` computes the same steps ``k+1 ...`` as the run that never stopped.
``run(cfg)`` returns the run directory.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import torch

from repro.batching.batch import Batch, concat_batches, pick, shard_batch, split_list
from repro.cluster.errors import WorkerError
from repro.cluster.signals import ignore_signals
from repro.cluster.worker_group import WorkerGroup, shutdown_ray
from repro.config import RunConfig, critic_enabled, ref_policy_used
from repro.config.rules import fill_optimizer_steps
from repro.rl import algorithms
from repro.rl.advantages import compute_advantage
from repro.rl.metrics import (
    MetricsLog,
    StepReporter,
    log,
    masked_stats,
    plot_curves,
    reduce_rank_metrics,
    summarize,
    throughput_metrics,
    timer,
    write_summary,
)
from repro.rl.step import (
    KLController,
    apply_kl_penalty,
    batch_metrics,
    decode_responses,
    rollout_corr_metrics,
    score_responses,
    timing_per_token_ms,
    token_level_scores,
)
from repro.rl.validation_metrics import validation_metrics
from repro.run.banner import banner_lines
from repro.run.checkpoints import CheckpointStore, write_json_atomic
from repro.run.claim import Claim, claim_run
from repro.run.interrupts import hold_after_checkpoint, mark_interrupted
from repro.run.paths import (
    RunPaths,
    resolve_builtin_assets,
    run_state,
    setup_logging,
    write_config_yaml,
    write_run_state,
)
from repro.run.resume import describe_changes
from repro.workers.hybrid import HybridWorker

# What each worker call needs from the batch (the rest stays on the driver).
_FORWARD_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
_ACTOR_KEYS = _FORWARD_KEYS + ("old_log_probs", "advantages", "ref_log_prob")
_CRITIC_KEYS = _FORWARD_KEYS + ("values", "returns")
TRAINER_STATE = "trainer_state.json"


class PPOTrainer:
    """Drives one run: builds the worker group, loops over steps, writes the run directory."""

    def __init__(self, cfg: RunConfig, paths: RunPaths) -> None:
        from repro.config import custom_reward
        from repro.data.prompts import PromptDataset
        from repro.data.tokenizer import load_tokenizer
        from repro.rewards import reward_lookup

        self.cfg, self.paths = cfg, paths
        plugin = custom_reward(cfg)
        self.custom_reward = plugin is not None
        self.get_reward_fn = reward_lookup(plugin)
        model = cfg.actor_rollout_ref.model
        self.tokenizer = load_tokenizer(model.tokenizer_path or model.path, model.trust_remote_code)
        self.train_ds = PromptDataset.from_config(cfg.data.train_files, self.tokenizer, cfg.data)
        self.val_ds = PromptDataset.from_config(cfg.data.val_files, self.tokenizer, cfg.data, shuffle=False)
        self.batch_size = cfg.data.train_batch_size
        self.steps_per_epoch = self.train_ds.steps_per_epoch(self.batch_size)
        if self.steps_per_epoch < 1:
            raise ValueError(
                f"data.train_batch_size={self.batch_size} is larger than the {len(self.train_ds)} prompts "
                f"of data.train_files={cfg.data.train_files}"
            )
        t = cfg.trainer
        self.total_steps = t.total_training_steps or self.steps_per_epoch * t.total_epochs
        self.use_critic = critic_enabled(cfg)
        self.use_ref = ref_policy_used(cfg)
        kl = cfg.algorithm.kl_ctrl
        self.kl_ctrl = KLController(kl.type, kl.kl_coef, kl.target_kl, kl.horizon)
        self.n = cfg.actor_rollout_ref.rollout.n
        self.group: WorkerGroup | None = None
        self._weights_stale = True

    # ---- data --------------------------------------------------------------------------------
    def step_indices(self, step: int) -> list[int]:
        """Prompt indices of ``step`` (1-based): the dataset's epoch order, a full batch per step."""
        epoch, k = divmod(step - 1, self.steps_per_epoch)
        return self.train_ds.order(epoch)[k * self.batch_size:(k + 1) * self.batch_size]

    def _sync_weights(self, version: int) -> None:
        """Refresh the rollout copies from the actor when an update (or the start) left them stale."""
        assert self.group is not None
        # Fault injection for the rollout-agreement test (tests/e2e/test_trainer.py): a
        # rollout that keeps the weights it had before the update must be caught by rollout_corr/*.
        if self._weights_stale and version > 1 and os.environ.get("REPRO_FAULT_STALE_ROLLOUT") == "1":
            self._weights_stale = False
        if self._weights_stale:
            self.group.execute_all_same("sync_weights", version)
            self._weights_stale = False

    # ---- one RL step --------------------------------------------------------------------------
    def _rollout(self, items: list[dict[str, Any]], n: int, step: int, purpose: str,
                 **gen_kwargs: Any) -> Batch:
        assert self.group is not None
        ids = [it["input_ids"] for it in items]
        pad_to = max(len(p) for p in ids)
        shards = split_list(ids, self.group.world)
        outs = self.group.execute_all("generate", shards, n=n, seed=self.cfg.trainer.seed, step=step,
                                      purpose=purpose, prompt_pad_to=pad_to, **gen_kwargs)
        return concat_batches([o for o in outs if o["input_ids"].shape[0]])

    def _score(self, items: list[dict[str, Any]], batch: Batch, n: int) -> torch.Tensor:
        texts = decode_responses(self.tokenizer, batch["responses"], batch["response_mask"])
        sources = [it["data_source"] for it in items for _ in range(n)]
        truths = [it["ground_truth"] for it in items for _ in range(n)]
        infos = [it["extra_info"] for it in items for _ in range(n)] if self.custom_reward else None
        return score_responses(texts, sources, truths, self.get_reward_fn, self.cfg.reward.reward_kwargs, infos)

    def _fan(self, method: str, batch: Batch, keys: tuple[str, ...]) -> list[Any]:
        assert self.group is not None
        return self.group.execute_all(method, shard_batch(pick(batch, keys), self.group.world))

    def train_step(self, step: int) -> dict[str, Any]:
        assert self.group is not None
        cfg, world = self.cfg, self.group.world
        timings: dict[str, float] = {}
        row: dict[str, Any] = {}
        with timer("step", timings):
            items = [self.train_ds[i] for i in self.step_indices(step)]
            with timer("update_weights", timings):
                self._sync_weights(step)
            with timer("gen", timings):
                batch = self._rollout(items, self.n, step, "train")
                if cfg.algorithm.adv_estimator == "remax":
                    # ReMax's baseline: one greedy response per prompt, scored like the samples; verl
                    # 0.9.1 generates and scores it in the same "gen" section.
                    greedy = self._rollout(items, 1, step, "remax_baseline", do_sample=False)
                    batch["reward_baselines"] = self._score(items, greedy, 1).repeat_interleave(self.n)
            with timer("reward", timings):
                scores = self._score(items, batch, self.n)
                batch["token_level_scores"] = token_level_scores(scores, batch["response_mask"])
            mask = batch["response_mask"]
            with timer("old_log_prob", timings):
                outs = self._fan("compute_log_prob", batch, _FORWARD_KEYS)
                batch["old_log_probs"] = torch.cat([o["log_probs"] for o in outs])
                if "rollout_log_probs" in batch:  # vLLM always, hf with rollout.calculate_log_probs
                    row.update(rollout_corr_metrics(batch["old_log_probs"], batch["rollout_log_probs"], mask))
                if all("entropy" in o for o in outs):
                    # Aggregated as the actor's loss is (verl): per token only with token-mean.
                    actor = cfg.actor_rollout_ref.actor
                    row["actor/entropy"] = algorithms.agg_loss(torch.cat([o["entropy"] for o in outs]), mask,
                                                               actor.loss_agg_mode,
                                                               loss_scale_factor=actor.loss_scale_factor).item()
            if self.use_ref:
                with timer("ref", timings):
                    outs = self._fan("compute_ref_log_prob", batch, _FORWARD_KEYS)
                    batch["ref_log_prob"] = torch.cat([o["log_probs"] for o in outs])
            if self.use_critic:
                with timer("values", timings):
                    outs = self._fan("compute_values", batch, _FORWARD_KEYS)
                    batch["values"] = torch.cat([o["values"] for o in outs])
            with timer("adv", timings):
                row.update(self._rewards_and_advantages(batch, step))
            if self.use_critic:
                with timer("update_critic", timings):
                    row.update(reduce_rank_metrics(self._fan("update_critic", batch, _CRITIC_KEYS)))
            if step > cfg.trainer.critic_warmup:
                with timer("update_actor", timings):
                    updated = reduce_rank_metrics(self._fan("update_actor", batch, _ACTOR_KEYS))
                    # verl's row: actor/entropy from the log-prob pass; the update's bonus is actor/entropy_loss.
                    updated.pop("actor/entropy", None)
                    row.update(updated)
                self._weights_stale = True
        row.update(batch_metrics(batch, scores, self.use_critic))
        row.update(timings)
        row.update(timing_per_token_ms(batch, timings))
        row["perf/cpu_memory_used_gb"] = psutil.virtual_memory().used / 2**30
        row.update(throughput_metrics(batch["attention_mask"], timings["timing_s/step"], world))
        row["training/global_step"] = step
        row["training/epoch"] = (step - 1) // self.steps_per_epoch
        return row

    def _rewards_and_advantages(self, batch: Batch, step: int) -> dict[str, float]:
        algo = self.cfg.algorithm
        mask = batch["response_mask"]
        out: dict[str, float] = {}
        rewards = batch["token_level_scores"]
        if algo.use_kl_in_reward:
            rewards, kl_metrics = apply_kl_penalty(batch, self.kl_ctrl, algo.kl_penalty)
            out.update(kl_metrics)
        batch["token_level_rewards"] = rewards
        adv, ret = compute_advantage(algo.adv_estimator, rewards, mask, torch.arange(rewards.shape[0]) // self.n,
                                     values=batch.get("values"), gamma=algo.gamma, lam=algo.lam,
                                     norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
                                     reward_baselines=batch.get("reward_baselines"))
        batch["advantages"], batch["returns"] = adv, ret
        return out

    # ---- validation ---------------------------------------------------------------------------
    def validate(self, step: int) -> dict[str, float]:
        vk = self.cfg.actor_rollout_ref.rollout.val_kwargs
        self._sync_weights(step)
        items = [self.val_ds[i] for i in range(len(self.val_ds))]
        batch = self._rollout(items, vk.n, step, "val", temperature=vk.temperature, top_p=vk.top_p,
                              top_k=vk.top_k, do_sample=vk.do_sample)
        scores = self._score(items, batch, vk.n)
        out = {"val/score/mean": scores.mean().item()}
        sources = [it["data_source"] for it in items for _ in range(vk.n)]
        prompts = [i for i in range(len(items)) for _ in range(vk.n)]
        out.update(validation_metrics(sources, prompts, {"reward": scores.tolist()}))
        out.update(masked_stats("val/response_length", batch["response_mask"].sum(dim=1).float()))
        return out

    # ---- checkpoints --------------------------------------------------------------------------
    def save(self, step: int) -> None:
        """Ranks write into a staging folder, then the driver adds its state and commits (manifest last)."""
        assert self.group is not None
        t = self.cfg.trainer
        store = CheckpointStore(self.paths.ckpt_dir)
        log.info("writing checkpoint %d to %s", step, self.paths.ckpt_dir)
        staging = store.begin(step)
        state = {"step": step, "kl_ctrl": self.kl_ctrl.state()}
        self.group.execute_all_same("save_checkpoint", str(staging), step, state)
        write_json_atomic(staging / TRAINER_STATE, state)
        step_dir = store.commit(step, keep={"actor": t.max_actor_ckpt_to_keep, "critic": t.max_critic_ckpt_to_keep})
        log.info("checkpoint saved: %s", step_dir)

    def load(self, step_dir: Path) -> int:
        assert self.group is not None
        self.group.execute_all_same("load_checkpoint", str(step_dir))
        state = json.loads((step_dir / TRAINER_STATE).read_text())
        self.kl_ctrl.load(state.get("kl_ctrl", {}))
        return int(state["step"])

    def verified_checkpoint(self) -> Path | None:
        """The checkpoint to resume from, verified against its manifest before any worker starts.

        ``resume_path`` must name an intact checkpoint (``ValueError`` naming the bad files);
        ``auto`` falls back past damaged ones, which are kept renamed (``CheckpointStore.resume``).
        """
        t, paths = self.cfg.trainer, self.paths
        if t.resume_mode == "resume_path" and paths.resumed_from is not None:
            CheckpointStore(paths.resumed_from.parent).check(paths.resumed_from)
            return paths.resumed_from
        if t.resume_mode != "auto":
            return None
        found = CheckpointStore(paths.ckpt_dir).resume()
        for note in found.notes:
            log.warning(note)
        if found.notes:
            write_run_state(paths.run_dir, resume_notes=found.notes)
        return found.path

    # ---- the run ------------------------------------------------------------------------------
    def fit(self) -> Path:
        cfg, t, run_dir = self.cfg, self.cfg.trainer, self.paths.run_dir
        started = time.time()
        metrics = MetricsLog(run_dir / "metrics.tsv")
        resume_from = self.verified_checkpoint()
        ckpt_key = "trainer.default_local_dir" if t.default_local_dir else "trainer.output_dir (its checkpoints/)"
        self.group = WorkerGroup(cfg, HybridWorker, cfg, shared_dirs=[(ckpt_key, self.paths.ckpt_dir)])
        for line in banner_lines(cfg, self.group.execute_all_same("engine_setup")[0], gpu=self.group.gpu):
            log.info(line)
        start = 0
        if resume_from is not None:
            start = self.load(resume_from)
            dropped = metrics.truncate_after(start)
            log.info("resumed from %s (step %d); %d later metric row(s) dropped to be recomputed",
                     resume_from, start, dropped)
        else:
            metrics.truncate_after(0)
        fresh = {"val_before_train": None} if start == 0 else {}
        write_run_state(run_dir, status="running", total_steps=self.total_steps, **fresh)
        log.info("run dir %s: steps %d..%d of %d (%d prompts x %d samples per step)", run_dir, start + 1,
                 self.total_steps, self.total_steps, self.batch_size, self.n)
        if t.val_before_train and start == 0:
            val0 = self.validate(0)["val/score/mean"]
            write_run_state(run_dir, val_before_train=val0)
            log.info("validation before training: score %.4f", val0)
        val0 = run_state(run_dir).get("val_before_train")
        reporter = StepReporter(self.total_steps, start, t.progress)
        try:
            for step in range(start + 1, self.total_steps + 1):
                profiled = step in t.profile_steps
                if profiled:
                    self.group.execute_all_same("profile_start", str(run_dir / "profile"), step)
                row = {"step": step, **self.train_step(step)}
                if profiled:
                    log.info("step %d profiled: %s", step, ", ".join(self.group.execute_all_same("profile_stop")))
                last = step == self.total_steps
                if t.test_freq > 0 and (step % t.test_freq == 0 or last):
                    with timer("testing", row):
                        row.update(self.validate(step))
                metrics.append(row)
                reporter.update(step, self.total_steps, row)
                if t.save_freq > 0 and (step % t.save_freq == 0 or last):
                    self.save(step)
                    hold_after_checkpoint(step)
                write_summary(run_dir / "summary.tsv", summarize(metrics.rows, val_before_train=val0))
                if step % 10 == 0 and not last:  # the last step's curves are drawn once, after the loop
                    plot_curves(metrics.rows, run_dir / "curves.png", title=run_dir.name, val_before_train=val0)
        finally:
            reporter.close()
            self.group.shutdown()
        wall = time.time() - started
        summary = summarize(metrics.rows, wall_s=wall, val_before_train=val0)
        write_summary(run_dir / "summary.tsv", summary)
        plot_curves(metrics.rows, run_dir / "curves.png", title=run_dir.name, val_before_train=val0)
        write_run_state(run_dir, status="finished", wall_s=round(wall, 2), last_step=self.total_steps)
        log.info("finished %d step(s) in %.1f s: score %s -> %s (tail-5 mean %s); outputs in %s",
                 summary["steps"], wall, _f(summary["first_score"]), _f(summary["last_score"]),
                 _f(summary["avg_score_tail5"]), run_dir)
        return run_dir


def _f(x: Any) -> str:
    return f"{x:.4f}" if isinstance(x, float) else str(x)


def run(cfg: RunConfig, claim: Claim | None = None) -> Path:
    """Run PPO / GRPO as configured; returns the run directory (metrics, summary, curves, logs).

    The run folder is claimed first (``repro.run.claim``: lock, same-run check; ``InputError``)
    unless the caller did. Ctrl-C / SIGTERM end in ``KeyboardInterrupt`` after ``run.json`` says
    ``interrupted``; a rank's failure in ``WorkerError`` (one line; the traceback is in ``train.log``).
    """
    if claim is None:
        with claim_run(cfg) as claim:
            return run(cfg, claim)
    paths, lock, changes = claim.paths, claim.lock, claim.changes
    handler = setup_logging(paths.run_dir)
    try:
        if lock.took_over:
            log.warning("took over the stale run.lock of %s (that process is gone)", lock.took_over.describe())
        for note in paths.start_notes():
            log.info(note)
        if changes:
            log.warning(describe_changes(changes))
        cfg = resolve_builtin_assets(cfg)
        trainer = PPOTrainer(cfg, paths)
        fill_optimizer_steps(cfg, trainer.total_steps)
        write_config_yaml(cfg, paths.run_dir / "config.yaml")
        return trainer.fit()
    except (KeyboardInterrupt, SystemExit) as e:
        # Ray's own SIGTERM handler calls sys.exit(SIGTERM) (cluster.start_ray puts ours back after it).
        if isinstance(e, SystemExit) and e.code != signal.SIGTERM:
            raise
        with ignore_signals():
            # Recorded before Ray stops: the record needs no cluster, and a stop that outlasts the
            # sender's grace (timeout -k, a batch system's kill wait) then still leaves it.
            log.error(mark_interrupted(paths))
            shutdown_ray()
        raise KeyboardInterrupt from None
    except WorkerError as e:
        log.debug("%s\n%s", e, e.details)
        write_run_state(paths.run_dir, status="failed", error=str(e))
        raise e.with_log(paths.run_dir / "train.log") from None
    except Exception as e:
        write_run_state(paths.run_dir, status="failed", error=f"{type(e).__name__}: {e}")
        raise
    finally:
        with ignore_signals():
            log.removeHandler(handler)
            handler.close()
            shutdown_ray()

"""One actor update of repro's DeepSpeed engine through verl's engine API, beside the same update
through repro's own ActorWorker, on CPU (one gloo rank, the toy Qwen3 model, fp32, ZeRO-2):
where verl's path adds time around the same engine (cProfile, cumulative).

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv-verl/bin/python scripts/verl_engine_overhead.py \
        --samples 128 [--no-checkpointing]

``--no-checkpointing`` turns off verl's default activation checkpointing (``HFModelConfig``'s
``enable_gradient_checkpointing: True``; repro's default is off). Built on the verl parity
harness (``tests/verl_parity/engine/harness.py``): the engine and its loss as verl's
TrainingWorker builds them, the batch as verl's workers hand it over (no padding).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
import time

os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29631")


def _timed(fn, label: str, rows: int) -> None:
    for _ in range(2):  # warm-up
        fn()
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    for _ in range(5):
        fn()
    prof.disable()
    print(f"== {label}: {(time.perf_counter() - start) / 5 * 1000:.1f} ms/update (under cProfile)")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=128, help="samples in the update (one micro-batch)")
    p.add_argument("--no-checkpointing", action="store_true", help="verl's activation checkpointing off")
    p.add_argument("--rows", type=int, default=40, help="profile rows printed per path")
    args = p.parse_args()
    import torch.distributed as dist

    from tests.distributed.workers.helpers import make_cfg, make_model_dir, make_step_batch
    from tests.verl_parity.engine import harness as h

    dist.init_process_group("gloo")
    n = args.samples
    h.MICRO, h.SAMPLES, h.MAX_TOKENS, h.PROMPT_LEN = n, n, 10**6, 16
    if args.no_checkpointing:
        configs = h.verl_configs

        def without_checkpointing(*a, **k):
            section, model = configs(*a, **k)
            object.__setattr__(model, "enable_gradient_checkpointing", False)
            return section, model

        h.verl_configs = without_checkpointing
    model_dir = make_model_dir(tempfile.mkdtemp() + "/model")
    batch = make_step_batch(100, n, prompt_len=16, resp_len=12)

    engine, loss_fn = h.new_engine(model_dir, 2, "actor", remove_padding=False)
    td = h.to_tensordict(batch, engine.engine_config, remove_padding=False)

    def verl_update() -> None:
        with engine.train_mode():
            engine.train_batch(td.clone(), loss_function=loss_fn)

    _timed(verl_update, "verl engine API: engine.train_batch", args.rows)

    from repro.workers.actor import ActorWorker

    cfg = make_cfg(model_dir, world=1, stage=2, micro=n, mini=n, n=1, train_batch_size=n, dynamic=False,
                   max_tokens=10**6, lr=h.LR, use_kl_loss=True)
    cfg.data.max_prompt_length, cfg.data.max_response_length = 16, 12
    worker = ActorWorker(cfg)
    _timed(lambda: worker.update_policy(batch), "repro: ActorWorker.update_policy", args.rows)


if __name__ == "__main__":
    main()

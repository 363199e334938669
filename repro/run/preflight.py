"""Checks of a run's inputs in the driver, before Ray or any worker starts.

A mistake in a data file, a model folder, the output folder, the device or the node count would
otherwise surface 30-90 s into a run as a raw traceback from deep inside pyarrow, transformers or
Ray (sometimes a misleading one: an empty model folder asks for sentencepiece). :func:`preflight`
finds them in a second or two and raises :class:`InputError` with one line naming the config key
and the file or value; ``repro.main_ppo`` prints it and exits with status 2.

What is checked (the built-in tiny policy and the built-in arithmetic data are skipped: repro
builds those itself):

- ``data.train_files`` / ``data.val_files``: each file exists, is not empty, is a parquet file
  (an empty file, a truncated one or a CSV renamed ``.parquet`` is refused), has the
  ``data.prompt_key`` and ``data.reward_fn_key`` columns; the training files hold at least
  ``data.train_batch_size`` rows, the validation files at least one.
- model folders (actor, critic when used, tokenizer_path): ``config.json`` present and valid
  JSON, weights present whose safetensors headers read with a shape of ``hidden_size``, a tokenizer
  file present (in ``tokenizer_path`` when that is set, else in the model folder).
- the output folder (``trainer.output_dir``, else ``$REPRO_OUTPUTS_DIR`` / ``outputs``) and
  ``trainer.default_local_dir``: not a file, and writable (a file is created and removed there).
- ``trainer.device=cuda``: this host has ``n_gpus_per_node`` GPUs (one node's worth of ranks
  runs here; the others are on the cluster's other nodes), and ``TORCH_CUDA_ARCH_LIST``, when set, is one
  that DeepSpeed's just-in-time op builder can read (:func:`check_cuda_arch_list`).
- ``trainer.nnodes``: see :func:`check_nodes` (reusable by the cluster code).
- rewards (:mod:`repro.run.preflight_rewards`): the reward plug-in loads and scores a sample; without
  one, every ``data_source`` in the data files has a rule reward.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from repro.cluster import placement
from repro.config import RunConfig, critic_enabled
from repro.data.policies import BUILT_ON, NAMES, built_in, is_built_in
from repro.devices import visible_gpus

# Any of these makes a folder loadable by AutoTokenizer (fast, sentencepiece, BPE, WordPiece, tiktoken).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt",
                   "tokenizer.tiktoken", "qwen.tiktoken")


class InputError(ValueError):
    """A problem with the user's input, found before any work starts: exit status 2, one line."""


def _files(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike)):
        return [str(value)]
    return [str(v) for v in value]


def check_data_files(key: str, value: Any, columns: tuple[tuple[str, str], ...], min_rows: int,
                     min_rows_key: str) -> None:
    """``value`` (one path or a list) names readable parquet files with ``columns`` and ``min_rows`` rows.

    ``columns`` pairs each required column with the config key that names it.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = _files(value)
    if value is not None and not files:
        raise InputError(f"{key}=[]: empty list; give one or more parquet files or leave it unset")
    rows = 0
    for f in files:
        path = Path(f)
        if not path.exists():
            raise InputError(f"{key}: {f} does not exist (leave it unset for the built-in arithmetic task)")
        if not path.is_file():
            raise InputError(f"{key}: {f} is not a file")
        if path.stat().st_size == 0:
            raise InputError(f"{key}: {f} is empty (0 bytes); expected a parquet file")
        try:
            meta = pq.ParquetFile(path)
            names = meta.schema_arrow.names
            n = meta.metadata.num_rows
        except (pa.ArrowException, OSError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise InputError(f"{key}: {f} is not a readable parquet file ({first})") from None
        for col, col_key in columns:
            if col not in names:
                raise InputError(f"{key}: {f} has no column {col!r} ({col_key}); its columns: {names}")
        rows += n
    if files and rows < min_rows:
        raise InputError(
            f"{key}: {', '.join(files)} have {rows} row(s) in all, fewer than {min_rows_key}={min_rows}"
        )


def check_model_dir(key: str, path: str, *, need_config: bool = True, need_tokenizer: bool = True) -> None:
    """``path`` is a Hugging Face model folder: ``config.json`` (valid JSON), weights whose headers read
    (:func:`check_weights`) and a tokenizer file (unless ``tokenizer_path`` names another folder)."""
    folder = Path(path)
    if not folder.is_dir():
        raise InputError(f"{key}={path!r} is not a local directory (use a Hugging Face model folder or a built-in "
                         f"policy: {', '.join(NAMES)})")
    if need_config:
        config = folder / "config.json"
        if not config.is_file():
            raise InputError(f"{key}={path!r} has no config.json; is it a Hugging Face model folder?")
        try:
            data = json.loads(config.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise InputError(f"{key}: {config} is not valid JSON ({e})") from None
        if not isinstance(data, dict):
            raise InputError(f"{key}: {config} is not a JSON object")
        check_weights(key, folder, data)
    if need_tokenizer and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(
            f"{key}={path!r} has no tokenizer file (one of {', '.join(TOKENIZER_FILES)}); "
            "set the tokenizer_path key next to it to a folder that has one"
        )


WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "model*.pt", "*.pth")


def check_weights(key: str, folder: Path, config: dict[str, Any]) -> None:
    """Weights are present, and safetensors headers read (a lazy read: no tensor is loaded).

    Without this a folder with a config and no weights passes and a worker fails ~30 s later
    deep inside ``from_pretrained``. The shapes must mention ``hidden_size`` somewhere: a header
    of another model's weights (or a truncated file) is caught here.
    """
    files = sorted({p for pat in WEIGHT_FILES for p in folder.glob(pat)})
    if not files:
        raise InputError(f"{key}={str(folder)!r} has no weights ({', '.join(WEIGHT_FILES)}); "
                         "is the download complete?")
    shards = [f for f in files if f.suffix == ".safetensors"]
    if not shards:
        return  # .bin/.pt need a full unpickle to inspect; their presence is what is checked
    from safetensors import safe_open

    dims: set[int] = set()
    for f in shards:
        try:
            with safe_open(str(f), framework="pt") as h:
                for name in h.keys():
                    dims.update(h.get_slice(name).get_shape())
        except Exception as e:  # noqa: BLE001 - a corrupt header raises several error types
            raise InputError(f"{key}: {f} is not a readable safetensors file ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''})") from None
    hidden = config.get("hidden_size") or config.get("n_embd") or config.get("d_model")
    if isinstance(hidden, int) and dims and hidden not in dims:
        raise InputError(f"{key}={str(folder)!r}: no weight tensor has hidden_size={hidden} of config.json "
                         "in its shape; are the weights of another model?")


def check_writable_dir(key: str, path: Path) -> None:
    """``path`` is (or can be made) a folder this process can write in; nothing is left behind."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        where = "is a file" if probe == path else f"cannot be created: {probe} is a file"
        raise InputError(f"{key}: {path} {where}; give a folder")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".repro-write-check.", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise InputError(f"{key}: {path} is not writable ({e.strerror or e} in {probe})") from None


def check_device(cfg: RunConfig, gpus: int | None = None) -> None:
    """``trainer.device=cuda`` needs ``n_gpus_per_node`` GPUs on this host."""
    t = cfg.trainer
    if t.device != "cuda":
        return
    have = visible_gpus() if gpus is None else gpus
    if have < t.n_gpus_per_node:
        raise InputError(
            f"trainer.device=cuda with trainer.n_gpus_per_node={t.n_gpus_per_node} needs "
            f"{t.n_gpus_per_node} GPU(s) on this host, which has {have}; lower trainer.n_gpus_per_node "
            "or use trainer.device=cpu (CPU ranks)"
        )


def check_cuda_arch_list(value: str | None) -> None:
    """``TORCH_CUDA_ARCH_LIST`` in the form DeepSpeed's JIT builder parses: ``X.Y`` or ``X.Y+PTX`` entries only.

    DeepSpeed builds FusedAdam and CPU Adam just in time and sorts this list with ``int()`` on each part, so
    an arch-specific entry such as ``9.0a`` (valid for PyTorch, set by some images) fails inside every rank's
    optimizer set-up with ``invalid literal for int() ... '0a'`` (deepspeedai/DeepSpeed#7589), after Ray,
    the model load and vLLM's start: seen on the GPU machine's image (results/seed_scale/README.md).
    """
    if not value or not value.strip():
        return
    for entry in value.replace(" ", ";").split(";"):
        parts = entry.strip().split(".") if entry.strip() else []
        if parts and not (len(parts) == 2 and all(part.split("+")[0].isdigit() for part in parts)):
            raise InputError(
                f"TORCH_CUDA_ARCH_LIST={value!r}: DeepSpeed's just-in-time op build cannot read {entry.strip()!r} "
                "(deepspeedai/DeepSpeed#7589); give X.Y entries without a suffix (e.g. TORCH_CUDA_ARCH_LIST=9.0 "
                "on H100) or unset it"
            )


def check_nodes(nnodes: int, address: str | None) -> None:
    """``trainer.nnodes>1`` needs a cluster to join (``repro.cluster.placement``'s rule, as an input error).

    Whether that cluster has enough alive nodes with the resources is known only once Ray is
    up: ``repro.cluster.placement.check_nodes`` refuses it there, before any rank starts.
    """
    try:
        placement.require_cluster_for_nodes(nnodes, address)
    except placement.PlacementError as e:
        raise InputError(str(e)) from None


def output_dirs(cfg: RunConfig) -> list[tuple[str, Path]]:
    """(key, folder) of every folder a run writes into."""
    from repro.run.paths import outputs_root

    t = cfg.trainer
    dirs = [("trainer.output_dir", Path(t.output_dir))] if t.output_dir else \
        [("trainer.output_dir (default $REPRO_OUTPUTS_DIR or ./outputs)", outputs_root())]
    if t.default_local_dir:
        dirs.append(("trainer.default_local_dir", Path(t.default_local_dir)))
    return dirs


def check_built_in(key: str, name: str) -> None:
    """A built-in policy that builds on a GPU is cached already or has a GPU to build on."""
    policy = built_in(name)
    if not policy.is_built() and visible_gpus() == 0:
        raise InputError(f"{key}={name} is built on a CUDA GPU and none is visible here: build it on a GPU machine "
                         f"(python -m repro.data policy {name}) and copy {policy.cached()} here, or pass a model folder")


def check_rewards(cfg: RunConfig) -> None:
    """See :func:`repro.run.preflight_rewards.check_rewards` (imported late: it imports the user's file)."""
    from repro.run.preflight_rewards import check_rewards as check

    try:
        check(cfg)
    except InputError:
        raise
    except ValueError as e:
        raise InputError(str(e)) from None


def preflight(cfg: RunConfig, *, dry: bool = False) -> list[str]:
    """Check ``cfg``'s inputs (module docstring). A real run raises :class:`InputError` at the first
    problem; a dry run (which loads nothing) gets every problem back as a note instead."""
    d = cfg.data
    cols = ((d.prompt_key, "data.prompt_key"), (d.reward_fn_key, "data.reward_fn_key"))
    checks: list[tuple[Any, ...]] = [
        (check_data_files, "data.train_files", d.train_files, cols, d.train_batch_size, "data.train_batch_size"),
        (check_data_files, "data.val_files", d.val_files, cols, 1, "1"),
    ]
    models = [("actor_rollout_ref.model", cfg.actor_rollout_ref.model)]
    if critic_enabled(cfg):
        models.append(("critic.model", cfg.critic.model))
    for key, model in models:
        if not is_built_in(model.path):
            # With tokenizer_path set, the tokenizer is looked for there, not in the model folder.
            checks.append((lambda k, p, t=not model.tokenizer_path: check_model_dir(k, p, need_tokenizer=t),
                           f"{key}.path", model.path))
        elif not dry and BUILT_ON[model.path] == "cuda":  # a CPU-built one can always be built here
            checks.append((check_built_in, f"{key}.path", model.path))
        if model.tokenizer_path:
            checks.append((lambda k, p: check_model_dir(k, p, need_config=False), f"{key}.tokenizer_path",
                           model.tokenizer_path))
    checks.append((check_rewards, cfg))
    if not dry:
        checks += [(check_writable_dir, key, path) for key, path in output_dirs(cfg)]
        checks.append((check_device, cfg))
        if cfg.trainer.device == "cuda":
            checks.append((check_cuda_arch_list, os.environ.get("TORCH_CUDA_ARCH_LIST")))
        checks.append((check_nodes, cfg.trainer.nnodes, placement.cluster_address(cfg.trainer.ray_address)))
    notes = []
    for fn, *args in checks:
        if dry and fn is not check_rewards and not all(Path(f).exists() for f in _files(args[1])):
            continue  # the config loader already noted a missing path (a dry run loads nothing)
        try:
            fn(*args)
        except InputError as e:
            if not dry:
                raise
            notes.append(f"{e} (a real run fails here)")
    return notes

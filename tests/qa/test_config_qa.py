"""The QA tasks' settings: the default run (the tiny-cpu preset, the dummy task, the offline tiny model), their
rejections, the shipped presets and sweeps and how they scale to 1-64 GPUs, .env.example (the machinery's precedence
and rejections: tests/unit/test_config.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from distqa.config import DEFAULT_PRESET, Config, ConfigError, fields_of
from distqa.config.sources import load_config
from distqa.tasks import REGISTERED, task_class

from support.repo import REPO_ROOT

pytestmark = pytest.mark.usefixtures("no_torchrun_env")


def load(argv: list[str] | None = None, environ: dict[str, str] | None = None,
         dotenv: Path | None = None) -> Config:
    return load_config(argv or [], environ=environ or {}, dotenv_path=dotenv or Path("/nonexistent/.env"))


def test_defaults_use_the_tiny_offline_preset() -> None:
    config = load()
    assert config.preset == DEFAULT_PRESET == "tiny-cpu"
    assert config.task == "dummy"
    assert config.from_scratch == "auto"  # the tiny model has no weights: random ones (tests/qa/test_encoders.py)
    assert Path(config.model_source).is_dir()


def test_bare_defaults_are_valid_and_offline() -> None:
    config = load(["--preset", "none"])
    assert config.preset == "none"
    assert config.lr == fields_of(Config)["lr"].default
    assert Path(config.model_source).is_dir()


@pytest.mark.parametrize(("argv", "message"), [
    (["--dropout", "1.5"], "dropout must be in [0, 1)"),
    (["--max-question-len", "126"], "leaves no room for the document"),
    (["--model-name-or-path", "data/no-such-model"], "model_name_or_path: "),
    (["--tokenizer-name-or-path", "./missing-tokenizer"], "tokenizer_name_or_path: "),
])
def test_the_qa_settings_rejections_name_the_field(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(argv)
    assert message in str(err.value)


def test_an_optional_qa_setting_reads_none() -> None:
    config = load(["--dropout", "0.25"])
    assert config.dropout == 0.25 and load(["--dropout", "none"]).dropout is None


def test_missing_paths_say_they_do_not_exist() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load(["--model-name-or-path", "data/no-such-model"])


def test_hub_names_are_not_paths_unless_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load(["--model-name-or-path", "bert-base-uncased", "--from-scratch", "false"]).model_source \
        == "bert-base-uncased"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE"):
        load(["--model-name-or-path", "bert-base-uncased"])


def test_shipped_presets_and_env_example_are_valid(tmp_path: Path) -> None:
    from support.repo import REPO_ROOT

    downloaded = tmp_path / "simplified-nq-train.jsonl"  # the real data is not in the repository
    downloaded.touch()
    for path in sorted((REPO_ROOT / "configs").glob("*.toml")):
        load(["--preset", str(path)], {"DISTQA_NQ_TRAIN_FILE": str(downloaded)})
    # .env.example documents every setting, and each documented one is a real field.
    example = (REPO_ROOT / ".env.example").read_text()
    documented = {line.lstrip("# ").split("=")[0] for line in example.splitlines()
                  if line.lstrip("# ").startswith("DISTQA_")}
    every = set().union(*(fields_of(task_class(task).config_class) for task in REGISTERED))
    assert documented == {"DISTQA_" + name.upper() for name in every}


def test_doc_stride_must_fit_the_window_for_nq_only(tmp_path: Path) -> None:
    small = ["--max-seq-len", "64", "--max-question-len", "16", "--doc-stride", "64"]
    with pytest.raises(ConfigError, match="--doc-stride is a setting of task 'nq', not of task 'dummy'"):
        load(small)  # the DummyDataset has no stride
    source = tmp_path / "nq.jsonl"
    source.touch()
    with pytest.raises(ConfigError, match=r"doc_stride \(64\) must be between 1 and .* = 45"):
        load([*small, "--task", "nq", "--nq-train-file", str(source)])


SCALING_WORLD_SIZES = (1, 2, 4, 8, 16, 32, 64)
GPU_PRESETS = ["bert-base", "bert-base-nq", "bert-large-nq", "roberta-large-nq", "deberta-v3-large-nq",
               "xlm-roberta-xl-squad"]


@pytest.mark.parametrize("preset_name", GPU_PRESETS)
@pytest.mark.parametrize("world_size", SCALING_WORLD_SIZES)
def test_the_real_presets_run_unchanged_on_1_to_64_gpus(preset_name: str, world_size: int) -> None:
    """What `torchrun ... -m distqa.train --preset P` does at this world size: load (which checks the batch
    arithmetic with torchrun's WORLD_SIZE), then scale to the world size as distqa.train does."""
    given = load(["--preset", preset_name, "--model-name-or-path", "data/tiny-bert"],
                 {"WORLD_SIZE": str(world_size), "DISTQA_NQ_TRAIN_FILE": "data/nq-sample/simplified-nq-train.jsonl"})
    config = given.for_world_size(world_size)
    accumulation = config.accumulation_steps(world_size)
    assert config.per_rank_batch_size == given.per_rank_batch_size == 32  # the micro-batch never changes
    assert config.global_batch_size == config.per_rank_batch_size * world_size * accumulation
    # The rule: keep the preset's global batch while the GPUs' micro-batches fit in it, else one micro-batch each.
    assert config.global_batch_size == max(given.global_batch_size, 32 * world_size)
    growth = config.global_batch_size / given.global_batch_size
    assert config.lr == pytest.approx(given.lr * growth ** 0.5)
    assert config.warmup_steps == -(-given.warmup_steps // growth)  # the same warm-up examples, in fewer steps
    assert config.warmup_steps * config.global_batch_size >= given.warmup_steps * given.global_batch_size


@pytest.mark.parametrize(("sweep_name", "world_size"), [("demo", 2), ("bert-base-nq", 8), ("bert-base-squad", 8)])
def test_the_shipped_sweeps_read_and_every_trial_loads_on_their_world_size(sweep_name: str, world_size: int) -> None:
    """configs/sweeps/: each file's settings exist for its task, and every corner of its space (each value, both ends
    of each range, every seed) loads with the trainer's rules on the world size its header names, and on one more GPU
    than the batches split over evenly (uneven shares); more GPUs than a global batch has examples are refused before
    any trial."""
    from distqa.sweeps.runner import settings_class  # the sweep's own choice of the task's settings
    from distqa.sweeps.space import check_trial_configs, read_sweep

    spec = read_sweep(sweep_name, lambda preset, task: settings_class(preset, task, []))

    def check(size: int) -> None:  # as the sweep checks a platform's trials: the data are the nodes', not here
        check_trial_configs(spec, lambda args: load_config([*args, "--model-name-or-path", "data/tiny-bert"],
                                                           {"WORLD_SIZE": str(size)}, dotenv_path="/nonexistent/.env",
                                                           check_data_paths=False))

    check(world_size)
    check(world_size + 1)
    with pytest.raises(ConfigError, match=r"is smaller than world_size \(65\)"):
        check(65)  # the sweeps' global batches are 16, 32 and the demo preset's 64


@pytest.mark.parametrize("preset_name", GPU_PRESETS)
def test_the_presets_document_their_scaling_table_as_computed(preset_name: str) -> None:
    """The table in each preset's comment (GPUs, global batch, lr) is what Config.for_world_size gives."""
    lines = (REPO_ROOT / "configs" / f"{preset_name}.toml").read_text().splitlines()
    table = {row.split()[1]: row.split()[2:] for row in lines if row.startswith("#   ")}
    table = {key: values[-len(SCALING_WORLD_SIZES):] for key, values in table.items()}
    given = load(["--preset", preset_name, "--model-name-or-path", "data/tiny-bert"],
                 {"DISTQA_NQ_TRAIN_FILE": "data/nq-sample/simplified-nq-train.jsonl"})
    assert [int(n) for n in table["GPUs"]] == list(SCALING_WORLD_SIZES)
    for column, world_size in enumerate(SCALING_WORLD_SIZES):
        config = given.for_world_size(world_size)
        assert int(table["global"][column]) == config.global_batch_size
        assert float(table["lr"][column]) == pytest.approx(config.lr, rel=0.03)

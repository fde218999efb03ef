"""Config precedence (defaults < preset < .env < environment < flags) and every rejection."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from distqa.config import DEFAULT_PRESET, Config, ConfigError, fields_of
from distqa.config.sources import load_config
from distqa.tasks import REGISTERED, task_class

from conftest import REPO_ROOT, clean_env

pytestmark = pytest.mark.usefixtures("no_torchrun_env")


def load(argv: list[str] | None = None, environ: dict[str, str] | None = None,
         dotenv: Path | None = None) -> Config:
    return load_config(argv or [], environ=environ or {}, dotenv_path=dotenv or Path("/nonexistent/.env"))


@pytest.fixture
def preset(tmp_path: Path) -> Path:
    path = tmp_path / "mine.toml"
    path.write_text('lr = 1e-3\nseed = 7\nwarmup_steps = 3\nlog_every = 4\nrun_name = "from-preset"\n')
    return path


def test_defaults_use_the_tiny_offline_preset() -> None:
    config = load()
    assert config.preset == DEFAULT_PRESET == "tiny-cpu"
    assert config.task == "dummy"
    assert config.from_scratch == "auto"  # the tiny model has no weights: random ones (tests/test_encoders.py)
    assert Path(config.model_source).is_dir()


def test_bare_defaults_are_valid_and_offline() -> None:
    config = load(["--preset", "none"])
    assert config.preset == "none"
    assert config.lr == fields_of(Config)["lr"].default
    assert Path(config.model_source).is_dir()


def test_precedence_defaults_preset_dotenv_environment_flags(preset: Path, tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text("DISTQA_SEED=8\nDISTQA_WARMUP_STEPS=5\nDISTQA_LOG_EVERY=6\nUNRELATED=1\n")
    environ = {"DISTQA_WARMUP_STEPS": "9", "DISTQA_LOG_EVERY": "11"}
    config = load(["--preset", str(preset), "--log-every", "12"], environ, dotenv)
    assert config.max_grad_norm == fields_of(Config)["max_grad_norm"].default  # default
    assert config.lr == 1e-3  # preset
    assert config.run_name == "from-preset"  # preset
    assert config.seed == 8  # .env over preset
    assert config.warmup_steps == 9  # environment over .env
    assert config.log_every == 12  # flag over everything


def test_preset_chosen_by_environment(preset: Path) -> None:
    assert load(environ={"DISTQA_PRESET": str(preset)}).lr == 1e-3
    assert load(["--preset", "none"], environ={"DISTQA_PRESET": str(preset)}).preset == "none"


def test_values_are_typed_from_strings() -> None:
    config = load(["--tensorboard", "no", "--dropout", "0.25", "--precision", "bf16"],
                  {"DISTQA_PROGRESS_BAR": "false", "DISTQA_LR": "3e-5"})
    assert config.tensorboard is False and config.progress_bar is False
    assert config.dropout == 0.25 and config.lr == 3e-5 and config.precision == "bf16"
    assert load(["--dropout", "none"]).dropout is None


def test_every_field_has_help_and_a_flag() -> None:
    from distqa.config.flags import build_arg_parser

    for task in REGISTERED:
        help_text = build_arg_parser(task=task_class(task)).format_help()
        for name, field in fields_of(task_class(task).config_class).items():
            assert field.metadata["help"], name
            assert "--" + name.replace("_", "-") in help_text


def test_resolved_config_round_trips() -> None:
    config = load(["--lr", "2e-4"])
    assert type(config)(**config.to_dict()) == config


@pytest.mark.parametrize(("argv", "environ", "message"), [
    (["--lr", "-1"], {}, "lr must be > 0"),
    (["--lr", "0"], {}, "lr must be > 0"),
    (["--per-rank-batch-size", "0"], {}, "per_rank_batch_size must be a positive integer"),
    (["--global-batch-size", "0"], {}, "global_batch_size must be a positive integer"),
    (["--max-steps", "-3"], {}, "max_steps must be >= 0"),
    (["--dropout", "1.5"], {}, "dropout must be in [0, 1)"),
    (["--max-question-len", "126"], {}, "leaves no room for the document"),
    (["--per-rank-batch-size", "64"], {}, "per_rank_batch_size (64) is larger than global_batch_size"),
    (["--run-name", "a/b"], {}, "run_name must be a plain directory name"),
    (["--lr", "fast"], {}, "lr: invalid value 'fast' from flag --lr: expected a number"),
    (["--epochs", "1.5"], {}, "epochs: invalid value '1.5' from flag --epochs"),
    (["--precision", "fp8"], {}, "choose one of ['auto', 'fp32', 'bf16', 'fp16']"),
    ([], {"DISTQA_TENSORBOARD": "maybe"}, "from environment variable DISTQA_TENSORBOARD: expected true or false"),
    ([], {"DISTQA_LEARNING_RATE": "1e-4"}, "environment variable DISTQA_LEARNING_RATE is not a setting"),
    (["--model-name-or-path", "data/no-such-model"], {}, "model_name_or_path: "),
    (["--tokenizer-name-or-path", "./missing-tokenizer"], {}, "tokenizer_name_or_path: "),
    (["--resume", "results/nothing/step-1.pt"], {}, "resume: "),
    (["--preset", "no-such-preset"], {}, "preset 'no-such-preset'"),
    ([], {"WORLD_SIZE": "zero"}, "WORLD_SIZE='zero' is not a positive integer"),
])
def test_rejections_name_the_field(argv: list[str], environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(argv, environ)
    assert message in str(err.value)


def test_missing_paths_say_they_do_not_exist() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load(["--model-name-or-path", "data/no-such-model"])


def test_hub_names_are_not_paths_unless_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load(["--model-name-or-path", "bert-base-uncased", "--from-scratch", "false"]).model_source \
        == "bert-base-uncased"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE"):
        load(["--model-name-or-path", "bert-base-uncased"])


def test_global_batch_must_split_over_the_world() -> None:
    with pytest.raises(ConfigError) as err:
        load(["--global-batch-size", "32", "--per-rank-batch-size", "6"], {"WORLD_SIZE": "2"})
    message = str(err.value)
    assert "global_batch_size (32) is not divisible by per_rank_batch_size (6) × world_size (2) = 12" in message
    assert "multiple of 12, or a per_rank_batch_size that divides 16" in message
    with pytest.raises(ConfigError, match=r"30 cannot even be split evenly over 4 ranks"):
        load(["--global-batch-size", "30", "--per-rank-batch-size", "2"], {"WORLD_SIZE": "4"})
    config = load(["--global-batch-size", "32", "--per-rank-batch-size", "4"], {"WORLD_SIZE": "2"})
    assert config.accumulation_steps(2) == 4
    assert config.accumulation_steps(4) == 2
    assert config.accumulation_steps(8) == 1


def test_unknown_preset_key_is_rejected_with_suggestion(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("learning_rate = 1e-4\n")
    with pytest.raises(ConfigError, match=r"unknown key 'learning_rate'"):
        load(["--preset", str(bad)])
    bad.write_text("lr = 'high'\n")
    with pytest.raises(ConfigError, match=r"lr: invalid value 'high' from preset"):
        load(["--preset", str(bad)])
    bad.write_text("epochs = true\n")
    with pytest.raises(ConfigError, match=r"epochs: invalid value True from preset .*expected an integer"):
        load(["--preset", str(bad)])
    bad.write_text("lr = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(["--preset", str(bad)])


def test_unknown_flag_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        load(["--learning-rate", "1e-4"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --learning-rate" in capsys.readouterr().err


def test_shipped_presets_and_env_example_are_valid(tmp_path: Path) -> None:
    from conftest import REPO_ROOT

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
    of each range, every seed) loads with the trainer's rules on the world size its header names; one more GPU
    than the batches split over is refused before any trial."""
    from distqa.sweep import settings_class  # the sweep's own choice of the task's settings
    from distqa.sweeps.space import check_trial_configs, read_sweep

    spec = read_sweep(sweep_name, lambda preset, task: settings_class(preset, task, []))

    def check(size: int) -> None:  # as the sweep checks a platform's trials: the data are the nodes', not here
        check_trial_configs(spec, lambda args: load_config([*args, "--model-name-or-path", "data/tiny-bert"],
                                                           {"WORLD_SIZE": str(size)}, dotenv_path="/nonexistent/.env",
                                                           check_data_paths=False))

    check(world_size)
    with pytest.raises(ConfigError, match="is not divisible by"):
        check(world_size * 2 if sweep_name == "demo" else world_size * 16)


@pytest.mark.parametrize("preset_name", GPU_PRESETS)
def test_the_presets_document_their_scaling_table_as_computed(preset_name: str) -> None:
    """The table in each preset's comment (GPUs, global batch, lr) is what Config.for_world_size gives."""
    lines = (Path(__file__).parents[1] / "configs" / f"{preset_name}.toml").read_text().splitlines()
    table = {row.split()[1]: row.split()[2:] for row in lines if row.startswith("#   ")}
    table = {key: values[-len(SCALING_WORLD_SIZES):] for key, values in table.items()}
    given = load(["--preset", preset_name, "--model-name-or-path", "data/tiny-bert"],
                 {"DISTQA_NQ_TRAIN_FILE": "data/nq-sample/simplified-nq-train.jsonl"})
    assert [int(n) for n in table["GPUs"]] == list(SCALING_WORLD_SIZES)
    for column, world_size in enumerate(SCALING_WORLD_SIZES):
        config = given.for_world_size(world_size)
        assert int(table["global"][column]) == config.global_batch_size
        assert float(table["lr"][column]) == pytest.approx(config.lr, rel=0.03)


def test_grow_global_batch_rounds_up_to_whole_micro_batches_and_is_off_by_default() -> None:
    config = load(["--global-batch-size", "32", "--per-rank-batch-size", "8", "--lr", "1e-4", "--warmup-steps",
                   "10", "--grow-global-batch", "true"], {"WORLD_SIZE": "3"})
    grown = config.for_world_size(3)  # 3 × 8 = 24 does not divide 32: the next multiple is 48
    assert (grown.global_batch_size, grown.accumulation_steps(3)) == (48, 2)
    assert grown.lr == pytest.approx(1e-4 * 1.5 ** 0.5) and grown.warmup_steps == 7
    assert config.for_world_size(4) == config  # 32 splits over 4 ranks: nothing changes
    with pytest.raises(ConfigError, match=r"= 24\. .*or --grow-global-batch true to let it grow"):
        load(["--global-batch-size", "32", "--per-rank-batch-size", "8"], {"WORLD_SIZE": "3"})


def test_the_run_directory_for_worker_sh_is_the_trainers(preset: Path, tmp_path: Path) -> None:
    """`python -m distqa.config.sources --run-dir` (worker.sh, before every node start) reads output_dir and
    run_name alone, without importing the task, and agrees with the full resolution whatever source sets them."""
    from distqa.config.sources import run_dir_of

    dotenv = tmp_path / ".env"
    dotenv.write_text("DISTQA_OUTPUT_DIR=from-dotenv\n")
    cases = [([], {}), (["--preset", str(preset)], {}), (["--preset", str(preset), "--run-name", "flag"], {}),
             (["--task", "nq", "--nq-cache-dir", "c"], {"DISTQA_RUN_NAME": "env"}), ([], {"DISTQA_OUTPUT_DIR": "o"})]
    for argv, environ in cases:
        assert run_dir_of(argv, environ, dotenv) == load(argv, environ, dotenv).run_dir, (argv, environ)
    assert run_dir_of([], {}, dotenv) == Path("from-dotenv/local")


def test_every_entry_point_and_script_reads_one_env_file_env_file_else_the_working_directorys(tmp_path: Path) -> None:
    """The trainer's settings (``python -m distqa.config.sources --run-dir``, which resolves them as train does) and the
    platform launcher (``--dry-run``: its node count) read the same file: ``$ENV_FILE``, else ``.env`` in the working
    directory, whatever the repository holds; an ENV_FILE naming no file is refused by both in one line."""
    here = tmp_path / "here"
    here.mkdir()
    (here / ".env").write_text("NODES=3\nDISTQA_RUN_NAME=from-here\n")
    other = tmp_path / "other.env"
    other.write_text("NODES=4\nDISTQA_RUN_NAME=from-other\n")

    def read(**env: str) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
        launcher = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "run_distributed_on_platform.sh"), "--dry-run",
                                   "--run-id", "t"], cwd=here, env=clean_env(**env), capture_output=True, text=True,
                                  timeout=60)
        trainer = subprocess.run([sys.executable, "-m", "distqa.config.sources", "--run-dir", "--preset", "none"],
                                 cwd=here,
                                 env=clean_env(**env), capture_output=True, text=True, timeout=60)
        return launcher, trainer

    for env, nodes, run_name in (({}, 3, "from-here"), ({"ENV_FILE": str(other)}, 4, "from-other")):
        launcher, trainer = read(**env)
        assert launcher.returncode == 0 and trainer.returncode == 0, launcher.stderr + trainer.stderr
        assert launcher.stdout.count(" run distributed_training ") == nodes, (env, launcher.stdout)
        assert Path(trainer.stdout.strip()).name == run_name, env
    missing = str(tmp_path / "missing.env")
    for result in read(ENV_FILE=missing):
        assert result.returncode == 2
        [line] = result.stderr.strip().splitlines()
        assert f"ENV_FILE={missing}: no such file" in line

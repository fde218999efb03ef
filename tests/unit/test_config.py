"""Config precedence (defaults < preset < .env < environment < flags) and every rejection, on the machinery task's
settings (the QA tasks' defaults, presets and rejections: tests/qa/test_config_qa.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from distqa.config import Config, ConfigError, fields_of
from distqa.config.sources import load_config
from distqa.tasks import available_tasks, task_class

from support.repo import MACHINERY_TASK

pytestmark = pytest.mark.usefixtures("no_torchrun_env")


def load(argv: list[str] | None = None, environ: dict[str, str] | None = None,
         dotenv: Path | None = None) -> Config:
    """The settings of a run of the machinery task (the QA tasks' own: tests/qa/test_config_qa.py)."""
    return load_config(["--task", MACHINERY_TASK, *(argv or [])], environ=environ or {},
                       dotenv_path=dotenv or Path("/nonexistent/.env"))


@pytest.fixture
def preset(tmp_path: Path) -> Path:
    path = tmp_path / "mine.toml"
    path.write_text('lr = 1e-3\nseed = 7\nwarmup_steps = 3\nlog_every = 4\nrun_name = "from-preset"\n')
    return path


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
    config = load(["--tensorboard", "no", "--classifier-dropout", "0.25", "--precision", "bf16"],
                  {"DISTQA_PROGRESS_BAR": "false", "DISTQA_LR": "3e-5"})
    assert config.tensorboard is False and config.progress_bar is False
    assert config.classifier_dropout == 0.25 and config.lr == 3e-5 and config.precision == "bf16"
    assert load(["--peak-tflops", "none"]).peak_tflops is None and load(["--peak-tflops", "7.5"]).peak_tflops == 7.5


def test_every_field_has_help_and_a_flag() -> None:
    from distqa.config.flags import build_arg_parser

    for task in [MACHINERY_TASK, *available_tasks()]:
        help_text = build_arg_parser(task=task_class(task)).format_help()
        for name, field in fields_of(task_class(task).config_class).items():
            assert field.metadata["help"], name
            assert "--" + name.replace("_", "-") in help_text


def test_resolved_config_round_trips() -> None:
    config = load(["--lr", "2e-4"])
    assert type(config)(**config.to_dict()) == config


@pytest.mark.parametrize(("argv", "environ", "message"), [
    (["--lr", "-1"], {}, "lr must be > 0"),
    (["--classifier-dropout", "1.5"], {}, "classifier_dropout must be in [0, 1)"),
    (["--lr", "0"], {}, "lr must be > 0"),
    (["--per-rank-batch-size", "0"], {}, "per_rank_batch_size must be a positive integer"),
    (["--global-batch-size", "0"], {}, "global_batch_size must be a positive integer"),
    (["--max-steps", "-3"], {}, "max_steps must be >= 0"),
    (["--per-rank-batch-size", "64"], {}, "per_rank_batch_size (64) is larger than global_batch_size"),
    (["--run-name", "a/b"], {}, "run_name must be a plain directory name"),
    (["--lr", "fast"], {}, "lr: invalid value 'fast' from flag --lr: expected a number"),
    (["--epochs", "1.5"], {}, "epochs: invalid value '1.5' from flag --epochs"),
    (["--precision", "fp8"], {}, "choose one of ['auto', 'fp32', 'bf16', 'fp16']"),
    ([], {"DISTQA_TENSORBOARD": "maybe"}, "from environment variable DISTQA_TENSORBOARD: expected true or false"),
    ([], {"DISTQA_LEARNING_RATE": "1e-4"}, "environment variable DISTQA_LEARNING_RATE is not a setting"),
    (["--resume", "results/nothing/step-1.pt"], {}, "resume: "),
    (["--preset", "no-such-preset"], {}, "preset 'no-such-preset'"),
    ([], {"WORLD_SIZE": "zero"}, "WORLD_SIZE='zero' is not a positive integer"),
])
def test_rejections_name_the_field(argv: list[str], environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(argv, environ)
    assert message in str(err.value)


def test_any_world_size_up_to_the_global_batch_trains_it_in_uneven_shares() -> None:
    """32 over 2, 4, 8 ranks of 4 splits evenly; over 6 ranks of 6 the shares are 6/5 in one micro-batch, over 3 of 4
    they are 11/10 in 3; a world size larger than the global batch leaves ranks without an example: refused."""
    config = load(["--global-batch-size", "32", "--per-rank-batch-size", "4"], {"WORLD_SIZE": "2"})
    assert [config.accumulation_steps(size) for size in (2, 4, 8, 3, 32)] == [4, 2, 1, 3, 1]
    uneven = load(["--global-batch-size", "32", "--per-rank-batch-size", "6"], {"WORLD_SIZE": "6"})
    assert uneven.accumulation_steps(6) == 1 and uneven.accumulation_steps(2) == 3
    with pytest.raises(ConfigError) as err:
        load(["--global-batch-size", "3", "--per-rank-batch-size", "1"], {"WORLD_SIZE": "4"})
    message = str(err.value)
    assert "global_batch_size (3) is smaller than world_size (4): 1 rank(s) would have no example to train" in message
    assert "a global_batch_size of at least 4, fewer ranks, or --grow-global-batch true" in message
    grown = load(["--global-batch-size", "3", "--per-rank-batch-size", "1", "--grow-global-batch", "true"],
                 {"WORLD_SIZE": "4"}).for_world_size(4)
    assert (grown.global_batch_size, grown.accumulation_steps(4)) == (4, 1)


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


def test_grow_global_batch_rounds_up_to_whole_micro_batches_and_is_off_by_default() -> None:
    config = load(["--global-batch-size", "32", "--per-rank-batch-size", "8", "--lr", "1e-4", "--warmup-steps",
                   "10", "--grow-global-batch", "true"], {"WORLD_SIZE": "3"})
    grown = config.for_world_size(3)  # 3 × 8 = 24 does not divide 32: the next multiple is 48
    assert (grown.global_batch_size, grown.accumulation_steps(3)) == (48, 2)
    assert grown.lr == pytest.approx(1e-4 * 1.5 ** 0.5) and grown.warmup_steps == 7
    assert config.for_world_size(4) == config  # 32 splits over 4 ranks: nothing changes
    # Off, 32 over 3 ranks of 8 is trained as it is: shares of 11/10 in 2 micro-batches.
    kept = load(["--global-batch-size", "32", "--per-rank-batch-size", "8"], {"WORLD_SIZE": "3"})
    assert kept.for_world_size(3) == kept and kept.accumulation_steps(3) == 2


def test_the_run_directory_for_worker_sh_is_the_trainers(preset: Path, tmp_path: Path) -> None:
    """`python -m distqa.config.sources --run-dir` (worker.sh, before every node start) reads output_dir and
    run_name alone, without importing the task, and agrees with the full resolution whatever source sets them."""
    from distqa.config.sources import run_dir_of

    dotenv = tmp_path / ".env"
    dotenv.write_text("DISTQA_OUTPUT_DIR=from-dotenv\n")
    cases = [([], {}), (["--preset", str(preset)], {}), (["--preset", str(preset), "--run-name", "flag"], {}),
             (["--embedding-dim", "8"], {"DISTQA_RUN_NAME": "env"}), ([], {"DISTQA_OUTPUT_DIR": "o"})]
    for argv, environ in cases:
        assert run_dir_of(argv, environ, dotenv) == load(argv, environ, dotenv).run_dir, (argv, environ)
    assert run_dir_of([], {}, dotenv) == Path("from-dotenv/local")




def test_the_removed_name_dataset_is_refused_in_one_line_naming_task(tmp_path: Path) -> None:
    """--dataset, DISTQA_DATASET and a preset's dataset key were renamed task (CHANGELOG.md); none loads."""
    with pytest.raises(ConfigError, match=r"^--dataset was renamed --task \(CHANGELOG.md\): write --task with the "
                                          r"same value.$"):
        load(["--dataset", "dummy"])
    with pytest.raises(ConfigError, match=r"^environment variable DISTQA_DATASET is not a setting; it was renamed "
                                          r"task \(CHANGELOG.md\): write task instead.$"):
        load(environ={"DISTQA_DATASET": "dummy"})
    old = tmp_path / "old.toml"
    old.write_text('dataset = "dummy"\n')
    with pytest.raises(ConfigError, match=rf"^preset {old}: unknown key 'dataset'; it was renamed task"):
        load(["--preset", str(old)])

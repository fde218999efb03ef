"""``python -m distqa.export``: a checkpoint becomes a Hugging Face directory that transformers loads offline, with
our logits, and that ``predict --checkpoint DIR`` reads to the file it writes from ``best.pt``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distqa.checkpoint.format import ModelCheckpoint, Progress
from distqa.config import ConfigError
from distqa.config.sources import load_config, saved_config
from distqa.encoders.tiny import FAMILIES as ENCODER_FAMILIES
from distqa.qa.hf_format import EXTRA_HEADS, RUN_FILE, export_model, load_model_checkpoint
from distqa.qa.model import QAModel, build_model
from distqa.record.rundir import versions

from support.processes import clean_env
from support.qa import QA_ARGS, TinyEncoder, tiny_encoder_of
from support.repo import REPO_ROOT

NQ_FIXTURE = REPO_ROOT / "tests" / "fixtures" / "nq-checkpoint"
"""An NQ best.pt with the submission predict wrote from it (its README.md)."""


def run(module: str, *args: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = clean_env(OMP_NUM_THREADS="1", **({"HF_HOME": str(home)} if home else {}))
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def export(checkpoint: Path, output: Path) -> Path:
    result = run("distqa.export", "--checkpoint", str(checkpoint), "--output", str(output))
    assert result.returncode == 0, result.stdout + result.stderr
    return output


@pytest.fixture(scope="module")
def nq_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export(NQ_FIXTURE / "best.pt", tmp_path_factory.mktemp("export") / "model")


def transformers_logits(directory: Path, inputs: dict[str, torch.Tensor], home: Path) -> dict[str, list]:
    """Start and end logits of ``AutoModelForQuestionAnswering.from_pretrained(directory)``, in a process of its
    own with an empty HF_HOME and HF_HUB_OFFLINE=1: nothing but the directory can be read."""
    script = (
        "import json, sys, torch\n"
        "from transformers import AutoModelForQuestionAnswering\n"
        "inputs = {k: torch.tensor(v) for k, v in json.loads(sys.stdin.read()).items()}\n"
        f"model = AutoModelForQuestionAnswering.from_pretrained({str(directory)!r}).eval()\n"
        "with torch.no_grad():\n"
        "    out = model(**inputs)\n"
        "print(json.dumps({'start': out.start_logits.tolist(), 'end': out.end_logits.tolist(), "
        "'class': type(model).__name__}))\n")
    given = json.dumps({name: tensor.tolist() for name, tensor in inputs.items()})
    result = subprocess.run([sys.executable, "-c", script], input=given,
                            cwd=directory.parent, env=clean_env(OMP_NUM_THREADS="1", HF_HOME=str(home)),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def our_logits(checkpoint: Path, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    saved = load_model_checkpoint(checkpoint)
    model = build_model(saved_config(saved.config), weights_from_checkpoint=True)
    model.load_state_dict(saved.model)
    with torch.no_grad():
        out = model.eval()(**inputs)
    return out.start_logits, out.end_logits


def window_inputs(tokenizer_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    encoded = tokenizer(["who wrote the book", "when was it built"],
                        ["the book was written by ada lovelace in london", "it was built in 1889 for the fair"],
                        padding=True, return_tensors="pt")
    return dict(encoded)


def test_transformers_loads_the_export_offline_with_our_logits(nq_export: Path, tmp_path: Path) -> None:
    assert {"config.json", "model.safetensors", "tokenizer.json", EXTRA_HEADS, RUN_FILE} <= \
        {p.name for p in nq_export.iterdir()}
    inputs = window_inputs(nq_export)
    theirs = transformers_logits(nq_export, inputs, home=tmp_path / "empty-hf-home")
    start, end = our_logits(NQ_FIXTURE / "best.pt", inputs)
    assert theirs["class"] == "BertForQuestionAnswering"
    assert torch.allclose(torch.tensor(theirs["start"]), start, atol=1e-6, rtol=0)
    assert torch.allclose(torch.tensor(theirs["end"]), end, atol=1e-6, rtol=0)
    assert not any((tmp_path / "empty-hf-home").rglob("*.safetensors"))  # nothing fetched


def test_predict_reads_the_export_to_the_same_submission_byte_for_byte(nq_export: Path, tmp_path: Path) -> None:
    submission = tmp_path / "submission.csv"
    result = run("distqa.predict", "--checkpoint", str(nq_export), "--input", "data/nq-sample/simplified-nq-test.jsonl",
                 "--output", str(submission), "--nq-cache-dir", str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr
    assert submission.read_bytes() == (NQ_FIXTURE / "expected-submission.csv").read_bytes()
    exported, original = load_model_checkpoint(nq_export), load_model_checkpoint(NQ_FIXTURE / "best.pt")
    assert exported.task_state == original.task_state and exported.evaluation == original.evaluation
    assert all(torch.equal(exported.model[name], tensor) for name, tensor in original.model.items())


@pytest.mark.parametrize(("make", "said"), [
    (lambda d: (d / "model").mkdir() or (d / "model" / "x").write_text(""), "exists and is not an empty directory"),
    (lambda d: None, "does not exist"),
])
def test_what_cannot_be_exported_is_one_line_and_exit_2(make, said: str, tmp_path: Path) -> None:
    make(tmp_path)
    checkpoint = NQ_FIXTURE / "best.pt" if "exists" in said else tmp_path / "missing.pt"
    result = run("distqa.export", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "model"))
    assert result.returncode == 2, result.stderr
    assert said in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_plain_transformers_directory_is_not_taken_for_an_export(nq_export: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("config.json", "model.safetensors"):
        (plain / name).write_bytes((nq_export / name).read_bytes())
    result = run("distqa.predict", "--checkpoint", str(plain), "--input", "data/nq-sample/simplified-nq-test.jsonl",
                 "--output", str(tmp_path / "s.csv"))
    assert result.returncode == 2 and f"without {RUN_FILE}" in result.stderr, result.stderr


def test_every_family_with_a_qa_outputs_head_exports_with_our_logits(tiny_encoder: TinyEncoder, tmp_path: Path) -> None:
    """A model of each encoder family (random weights), exported and loaded by transformers' own question-answering
    class, gives our start and end logits to 1e-6; ModernBERT, whose head has layers before its classifier, is
    refused in one line, with nothing left at the output."""
    config = load_config([*QA_ARGS, "--model-name-or-path", str(tiny_encoder.directory)], environ={},
                         dotenv_path="/nonexistent")
    torch.manual_seed(0)
    model = build_model(config).eval()
    for head in (model.span_head, model.answer_type_head):  # not the initial ones: every weight must arrive
        torch.nn.init.normal_(head.weight)
    checkpoint = ModelCheckpoint(model=model.state_dict(), config=config.to_dict(), task_state={"threshold": 0.5},
                                 evaluation=None, progress=Progress(step=3), versions=versions())
    output = tmp_path / "model"
    if tiny_encoder.family == "modernbert":
        with pytest.raises(ConfigError, match="ModernBertForQuestionAnswering has no qa_outputs"):
            export_model(checkpoint, output)
        assert not output.exists() and not list(tmp_path.iterdir())
        return
    export_model(checkpoint, output)
    from transformers import AutoModelForQuestionAnswering  # here: the module's other tests load it in a subprocess

    theirs = AutoModelForQuestionAnswering.from_pretrained(output, local_files_only=True).eval()
    inputs = {name: tensor for name, tensor in window_inputs(output).items() if name != "token_type_ids"
              or model.uses_token_types}
    with torch.no_grad():
        ours, exported = model(**inputs), theirs(**inputs)
    assert torch.allclose(exported.start_logits, ours.start_logits, atol=1e-6, rtol=0)
    assert torch.allclose(exported.end_logits, ours.end_logits, atol=1e-6, rtol=0)
    back = load_model_checkpoint(output)
    assert back.task_state == {"threshold": 0.5} and back.progress.step == 3
    assert all(torch.equal(back.model[name], tensor) for name, tensor in checkpoint.model.items())


# --- a squad checkpoint, and transformers 4's question-answering pipeline ---------------------------------------

TRANSFORMERS4 = REPO_ROOT / ".venv-transformers4" / "bin" / "python"
"""transformers 4 (``make setup``): transformers 5 removed the question-answering pipeline."""
SQUAD_DEV = REPO_ROOT / "data" / "squad-sample" / "dev.json"


@pytest.fixture(scope="module")
def squad_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """best.pt of a few steps of the tiny-squad preset (the committed SQuAD v2 sample), and its export beside it."""
    output = tmp_path_factory.mktemp("squad")
    result = run("distqa.train", "--preset", "tiny-squad", "--output-dir", str(output), "--run-name", "squad",
                 "--squad-cache-dir", str(output / "cache"), "--max-steps", "6", "--eval-every", "3",
                 "--checkpoint-every", "0", "--progress-bar", "false", "--tensorboard", "false")
    assert result.returncode == 0, result.stderr
    checkpoint = output / "squad" / "checkpoints" / "best.pt"
    export(checkpoint, output / "model")
    return checkpoint


def predict_squad(checkpoint: Path, output: Path, *extra: str) -> dict[str, str]:
    result = run("distqa.predict", "--checkpoint", str(checkpoint), "--input", str(SQUAD_DEV), "--output", str(output),
                 "--squad-cache-dir", str(output.parent / "cache"), *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(output.read_text())


def test_a_squad_export_predicts_the_same_file_byte_for_byte_with_our_logits(squad_run: Path, tmp_path: Path) -> None:
    exported = squad_run.parents[2] / "model"
    from_checkpoint = predict_squad(squad_run, tmp_path / "from-best.json")
    predict_squad(exported, tmp_path / "from-export.json")
    assert (tmp_path / "from-export.json").read_bytes() == (tmp_path / "from-best.json").read_bytes()
    assert len(from_checkpoint) == 119
    from transformers import AutoModelForQuestionAnswering  # here: the module's other tests load it in a subprocess

    theirs = AutoModelForQuestionAnswering.from_pretrained(exported, local_files_only=True).eval()
    inputs = window_inputs(exported)
    start, end = our_logits(squad_run, inputs)
    with torch.no_grad():
        out = theirs(**inputs)
    assert torch.allclose(out.start_logits, start, atol=1e-6, rtol=0)
    assert torch.allclose(out.end_logits, end, atol=1e-6, rtol=0)


PIPELINE_WINDOW_SETTINGS = {"max_seq_len": "max_seq_len", "doc_stride": "window_overlap",
                            "max_question_len": "max_question_len", "max_answer_len": "max_answer_len"}
"""The question-answering pipeline's keyword for each window setting of the run (the name in its config): given all
of them, it serves our answer spans."""


def test_the_documented_pipeline_call_passes_every_window_setting_of_its_run() -> None:
    """docs/EVALUATION.md's ``qa(...)`` recipe, for the tiny-squad preset's export, passes what the test above passes,
    with that preset's values, and ``align_to_words=False``."""
    doc = (REPO_ROOT / "docs" / "EVALUATION.md").read_text()
    [call] = re.findall(r"^qa\(question=.*?\)$", doc, re.MULTILINE | re.DOTALL)
    passed = dict(re.findall(r"(\w+)=(\w+)", call))
    config = load_config(["--preset", "tiny-squad"], environ={}, dotenv_path="/nonexistent").to_dict()
    assert passed.pop("align_to_words") == "False"
    assert {keyword: int(value) for keyword, value in passed.items()} == {
        keyword: config[name] for keyword, name in PIPELINE_WINDOW_SETTINGS.items()}


@pytest.mark.skipif(not TRANSFORMERS4.exists(), reason="no .venv-transformers4: run `make setup`")
def test_transformers_4s_pipeline_serves_the_export_with_our_answer_spans(squad_run: Path, tmp_path: Path) -> None:
    """``pipeline("question-answering", model=DIR)`` in a process of its own (transformers 4, an empty HF_HOME,
    offline) answers every answerable question of the sample with the span our predict gives. Our predict is asked
    to answer every question (a threshold below any score), the pipeline to keep to our windows and span length and
    to answer with tokens, not whole words; every context fits one window (max_seq_len 128), where the pipeline's
    per-window probabilities rank spans as our logits do."""
    exported = squad_run.parents[2] / "model"
    ours = predict_squad(exported, tmp_path / "predictions.json", "--no-answer-threshold=-1e9")
    config = json.loads((exported / "distqa.json").read_text())["config"]
    questions = [{"id": qa["id"], "question": qa["question"], "context": paragraph["context"]}
                 for article in json.loads(SQUAD_DEV.read_text())["data"] for paragraph in article["paragraphs"]
                 for qa in paragraph["qas"] if qa["answers"]]
    script = (
        "import json, sys\n"
        "from transformers import pipeline\n"
        "settings, questions = json.loads(sys.stdin.read())\n"
        f"qa = pipeline('question-answering', model={str(exported)!r}, device='cpu')\n"
        "print(json.dumps({q['id']: qa(question=q['question'], context=q['context'], align_to_words=False, "
        "handle_impossible_answer=False, **settings)['answer'] for q in questions}))\n")
    settings = {keyword: config[name] for keyword, name in PIPELINE_WINDOW_SETTINGS.items()}
    result = subprocess.run([str(TRANSFORMERS4), "-c", script], input=json.dumps([settings, questions]),
                            cwd=tmp_path, env=clean_env(OMP_NUM_THREADS="1", HF_HOME=str(tmp_path / "empty")),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    served = json.loads(result.stdout.splitlines()[-1])
    assert len(served) == len(questions) > 50 and len(set(served.values())) > 20  # spans, not one answer for all
    assert served == {question_id: ours[question_id] for question_id in served}


# --- every family's export in both transformers lines -----------------------------------------------------

LOAD_EXPORTS = """
import json, sys, torch, transformers
from transformers import AutoModelForQuestionAnswering, AutoTokenizer, pipeline
from transformers.pipelines import SUPPORTED_TASKS

question, context, *directories = sys.argv[1:]
for directory in directories:
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForQuestionAnswering.from_pretrained(directory).eval()
    encoded = tokenizer(question, context, return_tensors="pt")
    with torch.no_grad():
        out = model(**encoded)
    served = None
    if "question-answering" in SUPPORTED_TASKS:  # transformers 5 removed it
        qa = pipeline("question-answering", model=directory, device="cpu")
        served = qa(question=question, context=context, max_seq_len=64, max_question_len=16, doc_stride=16)
    print(json.dumps({"directory": directory, "version": transformers.__version__,
                      "tokenizer": type(tokenizer).__name__,
                      "inputs": {name: tensor.tolist() for name, tensor in encoded.items()},
                      "start": out.start_logits.tolist(), "end": out.end_logits.tolist(), "served": served}))
"""
PYTHONS = {"transformers 5": Path(sys.executable), "transformers 4": TRANSFORMERS4}
"""The two transformers lines the project supports: .venv's, and 4.57 in .venv-transformers4 (``make setup``)."""
EXPORTABLE_FAMILIES = [family for family in ENCODER_FAMILIES if family != "modernbert"]
"""Every family but ModernBERT, which the export refuses (test_every_family_with_a_qa_outputs_head_exports_...)."""


@pytest.fixture(scope="module")
def family_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[TinyEncoder, QAModel, Path]]:
    """Family -> its tiny encoder, a QA model of it with random weights, and that model's export."""
    exports = {}
    for family in EXPORTABLE_FAMILIES:
        encoder = tiny_encoder_of(family, tmp_path_factory)
        config = load_config([*QA_ARGS, "--model-name-or-path", str(encoder.directory)], environ={},
                             dotenv_path="/nonexistent")
        torch.manual_seed(0)
        model = build_model(config).eval()
        checkpoint = ModelCheckpoint(model=model.state_dict(), config=config.to_dict(), task_state={},
                                     evaluation=None, progress=Progress(step=1), versions=versions())
        exports[family] = encoder, model, export_model(checkpoint, tmp_path_factory.mktemp(family) / "model")
    return exports


@pytest.mark.parametrize("line", list(PYTHONS))
def test_every_family_export_loads_in_both_transformers_lines(
        family_exports: dict[str, tuple[TinyEncoder, QAModel, Path]], line: str, tmp_path: Path) -> None:
    """Each exportable family's directory, in a process of that transformers line (an empty HF_HOME, offline; one
    process reads every family's, so that each interpreter start-up serves five): ``AutoTokenizer`` encodes a pair
    as our tokenizer does, ``AutoModelForQuestionAnswering`` gives our logits for it (1e-5), and, where the version
    has it (4.x), ``pipeline("question-answering")`` answers with a span of the context."""
    python = PYTHONS[line]
    if not python.exists():
        pytest.skip(f"no {python}: run `make setup`")
    question, context = "who wrote the book", "the book was written by ada lovelace in london in 1843."
    directories = [str(output) for _, _, output in family_exports.values()]
    result = subprocess.run([str(python), "-c", LOAD_EXPORTS, question, context, *directories], cwd=tmp_path,
                            env=clean_env(OMP_NUM_THREADS="1", HF_HOME=str(tmp_path / "empty")),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    loaded = [json.loads(line_out) for line_out in result.stdout.splitlines() if line_out.startswith("{")]
    assert [entry["directory"] for entry in loaded] == directories
    for (family, (encoder, model, _)), entry in zip(family_exports.items(), loaded, strict=True):
        assert entry["version"].split(".")[0] == line.split()[-1]
        ours = dict(encoder.tokenizer(question, context, return_tensors="pt"))
        assert entry["inputs"] == {name: tensor.tolist() for name, tensor in ours.items()}, family
        with torch.no_grad():
            logits = model(**{name: tensor for name, tensor in ours.items()
                              if name != "token_type_ids" or model.uses_token_types})
        assert torch.allclose(torch.tensor(entry["start"]), logits.start_logits, atol=1e-5, rtol=0), family
        assert torch.allclose(torch.tensor(entry["end"]), logits.end_logits, atol=1e-5, rtol=0), family
        if line == "transformers 4":
            served = entry["served"]
            assert served is not None and context[served["start"]:served["end"]] == served["answer"] != "", family

"""Hub weights are downloaded once per run: global rank 0 fetches into HF_HOME, the other ranks wait
at a barrier and then load from the cache (src/distqa/encoders/pretrained.py: fetch_once). The hub is a
stand-in: a local directory that ``huggingface_hub.snapshot_download`` is replaced by, which writes
the hub cache layout into HF_HOME and counts its calls. No network: HF_ENDPOINT is a closed loopback
port, so any request for the real hub fails at once."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distqa.config.sources import load_config
from distqa.encoders.pretrained import hub_names

from support.processes import clean_env
from support.repo import REPO_ROOT

RANK_SCRIPT = r'''
import logging, os, sys, time
from pathlib import Path

import huggingface_hub
import torch.distributed as dist

hub_dir, count_file = Path(sys.argv[1]), Path(sys.argv[2])


def standin_snapshot_download(repo_id, allow_patterns=None, **kwargs):
    """The hub cache layout huggingface_hub writes: refs/main -> snapshots/<commit>/<files>."""
    with open(count_file, "a") as f:
        f.write(f"rank {os.environ['RANK']} fetched {repo_id}\n")
    time.sleep(1.0)  # a slow download: a rank that does not wait finds no files
    repo = Path(os.environ["HF_HOME"]) / "hub" / ("models--" + repo_id.replace("/", "--"))
    commit = "0" * 40
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for source in (hub_dir / repo_id).iterdir():
        (snapshot / source.name).write_bytes(source.read_bytes())
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return str(snapshot)


huggingface_hub.snapshot_download = standin_snapshot_download
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

from distqa.distributed.runtime import broadcast_object
from distqa.encoders.pretrained import fetch_once, load_encoder, load_encoder_config, load_tokenizer
from distqa.config.sources import load_config

config = load_config(["--preset", "none", "--model-name-or-path", "stand-in/tiny-bert"], dotenv_path=os.devnull)
dist.init_process_group("gloo")
fetch_once(config, dist.get_rank(), broadcast_object)
encoder = load_encoder(config, load_encoder_config(config))
tokenizer = load_tokenizer(config)
# One write of the whole line: print() writes the text and its newline apart, and unbuffered (PYTHONUNBUFFERED)
# the two ranks' lines could interleave into one ("rank 0 loaded … rank 1 loaded …\n\n").
sys.stdout.write(f"rank {dist.get_rank()} loaded {sum(p.numel() for p in encoder.parameters())} parameters, "
                 f"{len(tokenizer)} tokens\n")
dist.destroy_process_group()
'''


@pytest.fixture
def standin_hub(tmp_path: Path) -> Path:
    """A hub holding stand-in/tiny-bert: the committed tiny config and tokenizer plus random weights."""
    from transformers import AutoConfig, AutoModel

    repo = tmp_path / "hub" / "stand-in" / "tiny-bert"
    repo.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(REPO_ROOT / "data" / "tiny-bert" / name, repo / name)
    AutoModel.from_config(AutoConfig.from_pretrained(repo)).save_pretrained(repo)
    return tmp_path / "hub"


@pytest.mark.distributed
def test_two_ranks_fetch_the_hub_model_once_into_the_shared_hf_home(standin_hub: Path, tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    count = tmp_path / "fetches.txt"
    env = clean_env(HF_HOME=str(tmp_path / "hf-home"), OMP_NUM_THREADS="1",
                    PYTHONPATH=str(REPO_ROOT / "src"), GLOO_SOCKET_IFNAME="lo",
                    HF_ENDPOINT="http://127.0.0.1:9")  # a request that reaches for the hub fails at once, locally
    env["HF_HUB_OFFLINE"] = "0"  # a hub name is allowed; the stand-in hub is the only source
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             str(script), str(standin_hub), str(count)],
                            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert count.read_text().splitlines() == ["rank 0 fetched stand-in/tiny-bert"], "one fetch, by global rank 0"
    loaded = sorted(line for line in result.stdout.splitlines() if " loaded " in line)
    assert [line.split(" loaded ")[0] for line in loaded] == ["rank 0", "rank 1"]
    assert len({line.split(" loaded ")[1] for line in loaded}) == 1, "both ranks loaded the same model"
    assert "downloading it here" not in result.stderr, "rank 1 read the cache rank 0 filled"
    home = tmp_path / "hf-home"
    said = (f"INFO distqa.encoders.pretrained: model_name_or_path: downloaded 4 files of stand-in/tiny-bert "
            "into the hub cache "
            f"{home / 'hub'}")
    assert result.stderr.splitlines().count(said) == 1, "what was downloaded is said, once, by rank 0"


def test_local_sources_are_not_fetched(tmp_path: Path) -> None:
    local = load_config(["--preset", "none"], environ={}, dotenv_path=tmp_path / "none.env")
    assert hub_names(local) == []
    hub = load_config(["--preset", "none", "--model-name-or-path", "org/model", "--tokenizer-name-or-path",
                       "org/model"], environ={}, dotenv_path=tmp_path / "none.env")
    assert hub_names(hub) == ["org/model"]

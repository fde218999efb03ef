"""optuna-dashboard on a finished sweep's study.journal, as docs/SWEEPS.md tells a user to open it: the real
dashboard on 127.0.0.1, looked at by Debian's headless Chromium (`make setup` installs it), which must render the
study (its name, its best trial and the metric's name in the page, a screenshot that is not blank)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from PIL import Image

from distqa.config import Config
from distqa.sweeps import study as studies
from distqa.sweeps.space import read_sweep

from support.processes import clean_env, free_port, wait_for

CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")
DASHBOARD = Path(sys.executable).with_name("optuna-dashboard")


def finished_sweep(sweep_dir: Path) -> int:
    """A TPE sweep of 4 trials, made with the sweep's own study code and ended as the sweep ends them (3 done, 1
    pruned), without training; the best trial's number."""
    sweep_file = sweep_dir.parent / "dash.toml"
    sweep_file.write_text('search = "tpe"\ntrials = 4\n[space]\nlr = { low = 1e-5, high = 1e-2, log = true }\n')
    spec = read_sweep(str(sweep_file), lambda preset, task: Config)
    study = studies.create_study(sweep_dir, spec, {})
    for number, value in enumerate((0.71, 0.84, 0.42, 0.77)):
        trial = studies.next_trial(study, spec)
        trial.report(value, 10)
        summary = {"status": "FINISHED", "best_metric": "accuracy", "best_mode": "max", "best_value": value,
                   "step": 10, "pruned_at": 10 if number == 2 else 0}
        studies.record_outcome(study, trial.number, summary, "")
    return 1


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium: `make setup` installs chromium-headless-shell")
def test_optuna_dashboard_shows_a_finished_sweeps_journal_in_a_browser(tmp_path: Path) -> None:
    best = finished_sweep(tmp_path / "sweep")
    port = free_port()
    dashboard = subprocess.Popen([str(DASHBOARD), str(tmp_path / "sweep" / studies.JOURNAL_FILE), "--host",
                                  "127.0.0.1", "--port", str(port)], env=clean_env(), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
    page = f"http://127.0.0.1:{port}/dashboard/studies/0"

    def serving() -> bool:
        assert dashboard.poll() is None, dashboard.communicate()[1]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as answer:
                return json.load(answer)["study_summaries"][0]["study_name"] == studies.STUDY_NAME
        except OSError:
            return False

    browser = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,1000",
               "--virtual-time-budget=15000"]  # the page's own requests answered before the DOM is taken
    try:
        wait_for(serving, timeout=120)
        dom = subprocess.run([*browser, "--dump-dom", page], capture_output=True, text=True, timeout=120).stdout
        shot = subprocess.run([*browser, f"--screenshot={tmp_path / 'dashboard.png'}", page], capture_output=True,
                              text=True, timeout=120)
    finally:
        dashboard.terminate()
        dashboard.wait(timeout=60)
    assert f"{studies.STUDY_NAME} (id=0)" in dom, dom[-2000:]
    assert f"Best Trial (number={best})" in dom and "accuracy" in dom, "the study's trials, its metric named"
    assert shot.returncode == 0, shot.stderr[-2000:]
    with Image.open(tmp_path / "dashboard.png") as image:
        grey = image.convert("L")
        assert grey.size == (1400, 1000)
        dark = sum(count for level, count in enumerate(grey.histogram()) if level < 200)
        assert dark > 0.01 * 1400 * 1000, "the screenshot is blank"

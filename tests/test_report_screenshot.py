"""The Snakemake report of a real small run, opened in headless Chromium.

One module-scoped workflow run (hold policy, 2 tasks x 2 init states, 32 steps, videos on)
compared against a stored baseline run, then `snakemake --report report.html`. Snakemake's
report is a JavaScript app, so each test drives it to show one result (as clicking it in the
menu does), takes a screenshot and the rendered DOM, and checks that the chart was drawn
and carries its title. Needs /usr/bin/chromium (CI installs Debian's `chromium`).
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pandas as pd
import pytest
from conftest import make_record
from PIL import Image

from libero_eval.store import RESULT_COLUMNS, write_frame

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
RUN = "report_e2e"
BASELINE = "report_e2e_baseline"
REPORT_DIR = f"results/{RUN}/report"
COMPARE_DIR = f"results/compare/{BASELINE}_vs_{RUN}"

pytestmark = [
    pytest.mark.workflow,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (apt-get install -y chromium)"
    ),
]

# result path -> (report category, the caption's title)
CHARTS = {
    f"{REPORT_DIR}/success_by_suite.png": ("Success", "Success per suite."),
    f"{REPORT_DIR}/success_by_task.png": ("Success", "Success per task."),
    f"{REPORT_DIR}/first_success_step.png": ("Success", "Success vs episode step."),
    f"{REPORT_DIR}/latency_over_time.png": ("Performance", "Policy latency over time."),
    f"{REPORT_DIR}/throughput_over_time.png": ("Performance", "Throughput over time."),
    f"{COMPARE_DIR}/difference.png": ("Comparison", "Paired difference"),
}
PAGES = {
    f"{REPORT_DIR}/success_table.html": ("Success", "Success table."),
    f"{REPORT_DIR}/failures_by_error.html": ("Failures", "Failures by error."),
    f"{REPORT_DIR}/provenance.html": ("Provenance", "Configuration and provenance."),
    f"{REPORT_DIR}/videos.html": ("Episode videos", "Episode videos."),
    f"{COMPARE_DIR}/comparison.html": ("Comparison", "Paired comparison"),
}
CONFIG = f"""
run_id: {RUN}
plan: {{suites: [libero_spatial], task_ids: [0, 1], num_trials_per_task: 2}}
server: {{reference: {{policy: hold}}}}
rollout:
  send_privileged_state: false
  max_steps: 32
  videos: {{enabled: true, frame_stride: 4}}
compare: {{baseline: {BASELINE}, candidate: {RUN}}}
"""


def write_baseline(path: Path) -> None:
    """A stored run over the same 4 episodes in which task 0 / init 1 succeeded."""
    rows = []
    for index, (task_id, init) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
        success = (task_id, init) == (0, 1)
        rows.append(
            make_record(
                run_id=BASELINE,
                task_id=task_id,
                task_language=None,
                init_state_id=init,
                seed=0,  # plan.seed's default, which the run uses: the runs are comparable
                success_once=success,
                success_at_end=success,
                first_success_step=20 if success else None,
                steps=32,
                policy_calls=2,
                policy_latency_mean_s=None,
                policy_latency_p50_s=None,
                policy_latency_p95_s=None,
                wall_time_s=10.0,
                server_url=None,
                finished_at=1_700_000_000.0 + index,
            )
        )
    path.parent.mkdir(parents=True)
    write_frame(pd.DataFrame(rows, columns=RESULT_COLUMNS), path)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("report_e2e")
    (work / "config").symlink_to(REPO / "config")
    (work / "run.yaml").write_text(CONFIG)
    write_baseline(work / "results" / BASELINE / "summary" / "episodes.parquet")
    snakemake = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(work)]
    snakemake += ["--configfile", str(work / "run.yaml")]
    for extra in (["--cores", "2"], ["--report", str(work / "report.html")]):
        done = subprocess.run(
            [*snakemake, *extra], capture_output=True, text=True, timeout=600, cwd=work
        )
        assert done.returncode == 0, f"snakemake {extra}:\n{done.stderr[-4000:]}"
    return work


def report_data(work: Path) -> dict:
    """The report's embedded `results` table: path -> name, caption, data URI, ..."""
    page = (work / "report.html").read_text()
    match = re.search(r'<script id="results">\s*(.*?)\s*</script>', page, re.S)
    assert match, "report.html has no embedded results table"
    text = match.group(1)
    return json.loads(text[text.index("{") : text.rindex("}") + 1])


def open_in_chromium(work: Path, path: str, category: str, content: str) -> tuple[Path, str]:
    """Show result `path` in the report (what clicking it does); screenshot and DOM."""
    page = (work / "report.html").read_text()
    driver = (
        '<script>window.addEventListener("load", () => setTimeout(() => app.setView({'
        f'navbarMode: "resultinfo", category: {json.dumps(category)}, '
        f"resultPath: {json.dumps(path)}, content: {json.dumps(content)}, "
        f"contentPath: results[{json.dumps(path)}].data_uri}}), 300));</script>"
    )
    end = page.rindex("</body>")
    name = re.sub(r"\W", "_", path)
    driven = work / f"driven_{name}.html"
    driven.write_text(page[:end] + driver + page[end:])
    shot = work / f"shot_{name}.png"
    dom = chromium(work, f"--screenshot={shot}", "--dump-dom", driven.as_uri())
    assert shot.is_file(), "chromium wrote no screenshot"
    return shot, dom


def chromium(work: Path, *args: str) -> str:
    """Run headless Chromium (no network, throwaway profile); its stdout."""
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={work / 'chromium-profile'}",
        "--window-size=1600,1100",
        "--virtual-time-budget=8000",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120).stdout


def ink_and_colour(pixels: np.ndarray) -> tuple[float, float]:
    """Fractions of dark pixels (text, axes) and of saturated ones (bars, lines, markers)."""
    pixels = pixels.astype(int)
    ink = (pixels < 200).any(axis=2).mean()
    colour = (pixels.max(axis=2) - pixels.min(axis=2) > 60).mean()
    return ink, colour


def content_area(shot: Path) -> np.ndarray:
    """The right part of the window, where the report shows the selected result."""
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    return pixels[:, int(pixels.shape[1] * 0.45) :]


def test_every_chart_file_is_a_rendered_chart(workdir):
    for path in CHARTS:
        pixels = np.asarray(Image.open(workdir / path).convert("RGB"))
        ink, colour = ink_and_colour(pixels)
        assert 0.005 < ink < 0.6 and colour > 0.0005, f"{path}: ink {ink:.4f}, colour {colour:.5f}"


def test_report_is_self_contained_and_holds_every_result(workdir):
    page = (workdir / "report.html").read_text()
    assert not re.search(r'<(?:script|img|link)[^>]+(?:src|href)="https?://', page)
    results = report_data(workdir)
    assert set(CHARTS) | set(PAGES) <= set(results)
    for path in CHARTS:
        assert results[path]["data_uri"].startswith("data:image/png")
        assert (
            base64.b64decode(results[path]["data_uri"].split(",", 1)[1])
            == (workdir / path).read_bytes()
        )


def test_report_menu_lists_the_result_categories(workdir):
    landing = chromium(workdir, "--dump-dom", (workdir / "report.html").as_uri())
    menu = re.sub(r"<[^>]+>", "|", landing.split('id="app"', 1)[1][:20000])
    for category in ("Success", "Performance", "Failures", "Provenance", "Comparison"):
        assert f"|{category}|" in menu, f"category {category} missing from the report menu"
    assert "|Episode videos|" in menu


@pytest.mark.parametrize("path", list(CHARTS))
def test_chart_renders_in_the_report_with_its_title(workdir, path):
    category, title = CHARTS[path]
    shot, dom = open_in_chromium(workdir, path, category, "img")
    area = content_area(shot)
    ink, colour = ink_and_colour(area)
    assert ink * area[..., 0].size > 3000, f"{path}: the report shows no chart ({ink:.4f} ink)"
    assert colour * area[..., 0].size > 30, f"{path}: the chart in the report has no colour"
    shown = re.findall(r'<img src="data:image/png;[^"]*base64,([^"]+)"', dom)
    assert any(base64.b64decode(data) == (workdir / path).read_bytes() for data in shown)
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))
    assert title in text, f"{path}: caption title {title!r} not rendered"


@pytest.mark.parametrize("path", list(PAGES))
def test_table_page_renders_in_the_report_with_its_title(workdir, path):
    category, title = PAGES[path]
    shot, dom = open_in_chromium(workdir, path, category, "html")
    area = content_area(shot)
    ink, _ = ink_and_colour(area)
    assert ink * area[..., 0].size > 3000, f"{path}: the report shows an empty page"
    shown = re.findall(r'<iframe src="data:text/html;[^"]*base64,([^"]+)"', dom)
    assert [base64.b64decode(data) for data in shown] == [(workdir / path).read_bytes()]
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))
    assert title in text, f"{path}: caption title {title!r} not rendered"


def test_episode_videos_are_embedded_and_show_the_scene(workdir, tmp_path):
    page = base64.b64decode(
        report_data(workdir)[f"{REPORT_DIR}/videos.html"]["data_uri"].split(",", 1)[1]
    )
    videos = re.findall(rb'src="data:video/mp4;base64,([^"]+)"', page)
    assert len(videos) == 2  # one failure per task; the hold policy never succeeds
    for index, data in enumerate(videos):
        path = tmp_path / f"video{index}.mp4"
        path.write_bytes(base64.b64decode(data))
        frames = iio.imread(path)
        assert frames.ndim == 4 and frames.shape[0] >= 2
        assert frames[0].std() > 10, "the video's first frame is flat"
    assert b"libero_spatial/task00/init00: failure" in page

"""JupyterLab in a real headless browser, for tests/project/test_browser.py.

``lab_server`` starts ``jupyter lab`` on 127.0.0.1 with a random token and its own config, data,
runtime, settings and workspace folders (nothing of the user's is read or written) and stops it by its
process group, also on failure. ``run_notebook`` opens one notebook in Chromium (driven by Playwright),
notes whether JupyterLab shows it as modified before anything ran, runs all cells, waits for the kernel
and reads the rendered outputs into a ``NotebookReport``. Pitfalls handled (see NOTEBOOKS.md): "Run All"
ignored while the kernel connects (retried until a cell starts), a restored layout (``?reset``, and only
the visible notebook panel is read), and lazy rendering (``windowingMode: none`` in the overrides).
"""

import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CHROMIUM_FLAGS",
    "LabServer",
    "NotebookReport",
    "lab_server",
    "open_notebook",
    "run_notebook",
    "STANDARD_KERNELSPEC",
]

# The kernelspec JupyterLab writes for ipykernel's own kernel: any other stored value is rewritten when
# the kernel connects, and the notebook shows as modified before the reader touched it.
STANDARD_KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}

# Debian's Chromium in a container: no sandbox (root), no GPU, nothing that reaches the network.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]

# Settings for the test's lab only: every cell in the DOM (no lazy windowing), no news or update checks.
LAB_OVERRIDES = {
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
}

# Text of an error output (JupyterLab renders an error as stderr): IPython's traceback header, its
# "Cell In[3], line 1" frame line (also in a SyntaxError, which has no "Traceback" line), or a last
# line naming the exception. A warning ("file.py:3: UserWarning: ...") matches none of these.
_ERROR_TEXT = re.compile(
    r"Traceback \(most recent call last\)|Cell In\[\d+\], line \d+|(^|\n)\s*[\w.]*(Error|Exception)(:[^\n]*)?\s*$"
)

# Reads the visible notebook panel in one call: the code cells' prompts, stderr texts, tables, images.
_READ_PANEL = """panel => {
  const prompts = [...panel.querySelectorAll('.jp-Cell.jp-CodeCell')].map(
    cell => (cell.querySelector('.jp-InputArea-prompt')?.textContent || '').trim());
  const stderr = [...panel.querySelectorAll(
    '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')].map(e => e.textContent);
  const status = panel.querySelector('.jp-Notebook-ExecutionIndicator')?.getAttribute('data-status') || '';
  return {prompts, stderr, status,
          tables: panel.querySelectorAll('.jp-RenderedHTMLCommon table').length,
          images: panel.querySelectorAll('.jp-RenderedImage img').length,
          height: Math.max(0, ...[...panel.querySelectorAll('.jp-Notebook, .jp-WindowedPanel-outer, .jp-WindowedPanel-inner')]
                                   .map(e => e.scrollHeight))};
}"""

# Taller screenshots are cut here (a few MB of PNG; Chromium draws larger windows unreliably).
MAX_SCREENSHOT_HEIGHT = 30000

_COUNT = re.compile(r"^\[(\d+)\]:?$")


@dataclass(frozen=True)
class LabServer:
    """A running JupyterLab: ``url`` (no trailing slash), ``token``, the folder it serves, its log file."""

    url: str
    token: str
    root: Path
    log: Path

    def tree_url(self, name: str) -> str:
        """The address that opens ``name`` (relative to ``root``) in a fresh layout, authenticated."""
        return f"{self.url}/lab/tree/{name}?reset&token={self.token}"


@dataclass(frozen=True)
class NotebookReport:
    """What the browser showed for one notebook.

    ``dirty_on_open``: the tab carried ``jp-mod-dirty`` once the kernel was idle, before anything ran.
    ``prompts``: each code cell's input prompt after the run (``[3]:`` ran, ``[ ]:`` did not).
    ``errors``: the text of every error output (tracebacks rendered as stderr).
    ``tables``/``images``: rendered HTML tables and images. ``screenshot``: the full-notebook PNG.
    ``run_all_clicks``: how often Run All had to be clicked before a cell started.
    """

    name: str
    dirty_on_open: bool
    prompts: tuple[str, ...]
    errors: tuple[str, ...]
    tables: int
    images: int
    screenshot: Path | None
    run_all_clicks: int
    seconds: float
    kernel_status: str = ""

    @property
    def not_run(self) -> tuple[int, ...]:
        """Indices (among the code cells) of the cells that show no execution count."""
        return tuple(i for i, p in enumerate(self.prompts) if not _COUNT.match(p))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM the lab's process group (the server and its kernels), SIGKILL it after 20 s."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):  # kernels left behind by a server that died
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


@contextlib.contextmanager
def lab_server(root: Path, home: Path, env: dict[str, str] | None = None, timeout: float = 180) -> Iterator[LabServer]:
    """Start JupyterLab serving ``root``, with every Jupyter/IPython folder under ``home``; stop it on exit.

    Args:
        root: the folder of notebooks to serve (the kernel's working directory).
        home: an empty folder for the lab's config, data, runtime, settings and workspaces.
        env: extra environment variables for the server and its kernels.
        timeout: seconds to wait for the server to answer.
    Raises:
        RuntimeError: the server exited or did not answer in time (the message ends with its log).
    """
    folders = {
        name: home / name for name in ("config", "data", "runtime", "settings", "user-settings", "ws", "ipython")
    }
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    (folders["settings"] / "overrides.json").write_text(json.dumps(LAB_OVERRIDES, indent=2))
    full_env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(folders["config"]),
        "JUPYTER_DATA_DIR": str(folders["data"]),
        "JUPYTER_RUNTIME_DIR": str(folders["runtime"]),
        "JUPYTERLAB_SETTINGS_DIR": str(folders["user-settings"]),
        "JUPYTERLAB_WORKSPACES_DIR": str(folders["ws"]),
        "IPYTHONDIR": str(folders["ipython"]),
        "JUPYTER_PLATFORM_DIRS": "1",
        **(env or {}),
    }
    port, token = _free_port(), secrets.token_hex(16)
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.app_settings_dir={folders['settings']}",
        f"--LabApp.user_settings_dir={folders['user-settings']}",
        f"--LabApp.workspaces_dir={folders['ws']}",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")  # root in a container: JupyterLab refuses to start without it
    log = home / "lab.log"
    with open(log, "wb") as log_file:
        process = subprocess.Popen(
            command, cwd=root, env=full_env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = LabServer(url=f"http://127.0.0.1:{port}", token=token, root=root, log=log)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{server.url}/api/status?token={token}", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"jupyter lab did not answer in {timeout:.0f} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield server
    finally:
        _stop(process)


def _read(panel) -> dict:
    return panel.evaluate(_READ_PANEL)


def _started(state: dict) -> bool:
    return any(p == "[*]:" or p == "[*]" or _COUNT.match(p) for p in state["prompts"])


def _finished(state: dict) -> bool:
    """No cell queued or running, and either every code cell ran or an error stopped Run All."""
    if state["status"] != "idle" or any("*" in p for p in state["prompts"]):
        return False
    return all(_COUNT.match(p) for p in state["prompts"]) or any(_ERROR_TEXT.search(t) for t in state["stderr"])


def _run_all(page, panel, attempts: int = 4, wait_start: float = 20) -> int:
    """Click Run > Run All Cells until a cell shows ``[*]`` or a count; returns the clicks needed."""
    for attempt in range(1, attempts + 1):
        page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
        page.locator(".lm-Menu-item:visible", has_text=re.compile(r"^Run All Cells")).first.click()
        deadline = time.monotonic() + wait_start
        while time.monotonic() < deadline:
            if _started(_read(panel)):
                return attempt
            time.sleep(0.25)
    raise AssertionError(f"Run All did not start any cell after {attempts} clicks")


def open_notebook(
    page, server: LabServer, name: str, kernel_timeout: float = 180, settle: float = 4, stable: float = 2.5
):
    """Open ``name`` in a fresh layout, wait for its kernel, and tell whether its tab shows it as modified.

    Args:
        page: a Playwright page of a fresh browser context.
        server: the running lab (``lab_server``).
        name: the notebook's path relative to ``server.root``.
        kernel_timeout: seconds for the notebook to open and its kernel to report idle.
        settle: seconds to watch the tab after that, at least: JupyterLab rewrites a non-standard
            kernelspec (or another Python's ``language_info``) once the kernel's session is connected,
            up to seconds after the first "idle", and marks the notebook modified; on the first load in a
            fresh browser the tab also reads modified for a moment while the notebook initialises.
        stable: the tab's state must then have stayed the same this many seconds (at most 30 s more).
    Returns:
        ``(panel, dirty)``: the visible notebook panel (a Playwright locator) and whether its tab carries
        ``jp-mod-dirty``.
    Raises:
        playwright's TimeoutError: the notebook did not open or its kernel never became idle.
    """
    page.goto(server.tree_url(name), wait_until="domcontentloaded", timeout=kernel_timeout * 1000)
    panel = page.locator(".jp-NotebookPanel:visible").first
    panel.wait_for(state="visible", timeout=kernel_timeout * 1000)
    tab = page.locator(".jp-mod-current.lm-TabBar-tab", has_text=Path(name).name).first
    indicator = panel.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]')
    indicator.wait_for(state="attached", timeout=kernel_timeout * 1000)
    start = changed = time.monotonic()
    dirty = None
    while True:
        now_dirty = "jp-mod-dirty" in (tab.get_attribute("class") or "")
        now = time.monotonic()
        if now_dirty != dirty:
            dirty, changed = now_dirty, now
        if (now - start >= settle and now - changed >= stable) or now - start > settle + 30:
            return panel, dirty
        time.sleep(0.25)


def run_notebook(
    page, server: LabServer, name: str, screenshot: Path | None, kernel_timeout: float = 180, run_timeout: float = 600
) -> NotebookReport:
    """Open ``name`` in ``page`` (``open_notebook``), Run All, wait for every cell, and read the outputs.

    Args:
        page: a Playwright page of a fresh browser context.
        server: the running lab (``lab_server``).
        name: the notebook's path relative to ``server.root``.
        screenshot: where to save a PNG of the whole notebook after the run (None: no screenshot).
        kernel_timeout: seconds for the notebook to open and its kernel to become idle.
        run_timeout: seconds for every cell to run.
    Raises:
        AssertionError: Run All never started a cell, or cells were still running after ``run_timeout``.
    """
    begin = time.monotonic()
    panel, dirty_on_open = open_notebook(page, server, name, kernel_timeout)

    clicks = _run_all(page, panel)
    deadline = time.monotonic() + run_timeout
    settled = 0
    while True:
        state = _read(panel)
        settled = settled + 1 if _finished(state) else 0
        if settled >= 3:  # three reads in a row: not a gap between two queued cells
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"{name}: cells still running after {run_timeout:.0f} s: {state['prompts']}")
        time.sleep(1)

    path = None
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        width = page.viewport_size["width"] if page.viewport_size else 1280
        # A wide notebook: fold the file browser away (clicking its open tab), if it is open.
        side_tab = page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")
        if side_tab.count():
            side_tab.first.click()
        # The notebook scrolls inside the app: make the window as tall as the notebook, then capture it.
        height = _read(panel)["height"]
        page.set_viewport_size({"width": width, "height": min(max(900, height + 250), MAX_SCREENSHOT_HEIGHT)})
        panel.evaluate("p => p.querySelectorAll('.jp-WindowedPanel-outer').forEach(e => { e.scrollTop = 0; })")
        time.sleep(1.5)
        page.screenshot(path=str(screenshot), full_page=True)
        path = screenshot
    return NotebookReport(
        name=name,
        dirty_on_open=dirty_on_open,
        prompts=tuple(state["prompts"]),
        errors=tuple(t for t in state["stderr"] if _ERROR_TEXT.search(t)),
        tables=state["tables"],
        images=state["images"],
        screenshot=path,
        run_all_clicks=clicks,
        seconds=time.monotonic() - begin,
        kernel_status=state["status"],
    )

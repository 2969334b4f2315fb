"""The extension in a real VS Code: code-server 4.139 (VS Code 1.139) on 127.0.0.1 with the
built .vsix, driven through Chromium as a person would: the Problems panel, a hover, a code
lens, Optimize from the command palette against the scripted OpenAI-compatible endpoint, the
candidate diff and its Apply button, and what an untrusted workspace says.

On the CPU: the planted nvcc error, hover and lens need only nvcc; Optimize runs the PyTorch
task of the editor tests (tests/cpu_task.py), which the Worker can measure without a GPU.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.agent.openai_server import start
from tests.cpu_task import FASTER, TASK, fenced
from vscode import CHROMIUM, REPO, code_server

pytestmark = pytest.mark.vscode_e2e

EXAMPLES = REPO / "examples"
# `scale` is not declared: nvcc's error lands on line 49, column 92.
PLANTED = (EXAMPLES / "softmax.cu").read_text().replace("* inv;", "* inv * scale;", 1)
assert PLANTED != (EXAMPLES / "softmax.cu").read_text()
SCREENSHOTS = Path(__file__).resolve().parent / "screenshots"


def poll(what: str, fn: Callable[[], object], timeout: float = 60, interval: float = 0.5) -> object:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


class Workbench:
    """The few things a person does in VS Code, by keyboard and by what is on the screen."""

    def __init__(self, page, root: Path) -> None:
        self.page = page
        self.root = root

    def shot(self, name: str) -> None:
        SCREENSHOTS.mkdir(exist_ok=True)
        self.page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))

    def quick_input(self, keys: str, text: str, row: str) -> None:
        """Open a quick input with `keys`, type `text`, wait for a row holding `row`, pick it."""
        page = self.page
        box = page.locator(".quick-input-widget input")
        for _ in range(3):  # the workbench may still be taking focus: try the keys again
            page.keyboard.press(keys)
            try:
                box.wait_for(state="visible", timeout=5000)
                break
            except Exception:
                page.locator(".monaco-workbench").click(position={"x": 600, "y": 300})
        box.fill(text)
        page.locator(".quick-input-list .monaco-list-row", has_text=row).first.wait_for(timeout=15000)
        page.keyboard.press("Enter")
        box.wait_for(state="hidden", timeout=15000)

    def open_file(self, name: str) -> None:
        self.quick_input("Control+P", name, name)
        self.page.locator(".tabs-container .tab.active", has_text=name).wait_for(timeout=15000)
        self.page.locator(".monaco-editor .view-lines").first.wait_for(timeout=15000)

    def command(self, title: str) -> None:
        self.quick_input("F1", ">" + title, title)

    def go_to(self, line: int, column: int) -> None:
        self.quick_input("Control+G", f":{line}:{column}", "")

    def problems(self) -> list[str]:
        rows = self.page.locator(".markers-panel .monaco-list-row")
        return [" ".join(t.split()) for t in rows.all_inner_texts()]

    def lenses(self) -> list[str]:
        return [t.strip() for t in self.page.locator(".monaco-editor .codelens-decoration").all_inner_texts() if t.strip()]

    def notifications(self) -> list[str]:
        return [" ".join(t.split()) for t in self.page.locator(".notification-toast").all_inner_texts()]

    def editor_text(self) -> str:
        return self.page.locator(".monaco-editor .view-lines").first.inner_text()


@pytest.fixture(autouse=True)
def screenshot_on_failure(request):
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for name in ("trusted", "untrusted"):
            if name in request.fixturenames:
                request.getfixturevalue(name).shot(f"failed-{request.node.name}")


@pytest.fixture(scope="module")
def playwright():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:  # one per module: a second one inside the first's loop fails
        yield p


def launch(p, root: Path, folder: Path, settings: dict, env: dict[str, str], trust: bool) -> Iterator[Workbench]:
    with code_server(root, settings, env, trust) as cs:
        # Debian's Chromium, not a browser of Playwright's own; root needs --no-sandbox.
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(30000)
            page.goto(cs.open_folder(folder))
            page.locator(".monaco-workbench .part.editor").wait_for(timeout=90000)
            page.locator(".explorer-folders-view .monaco-list-row").first.wait_for(timeout=60000)
            wb = Workbench(page, root)
            try:
                yield wb
            except BaseException:
                wb.shot("failure")
                sys.stderr.write(cs.log.read_text()[-4000:])
                for log in root.glob("user-data/logs/*/exthost*/output_logging_*/*kernel-lsp*.log"):
                    sys.stderr.write(f"\n--- {log.name}\n{log.read_text()[-6000:]}")
                raise
        finally:
            browser.close()


@pytest.fixture(scope="module")
def endpoint():
    server = start([])
    yield server
    server.close()


@pytest.fixture(scope="module")
def trusted(tmp_path_factory, endpoint, playwright) -> Iterator[Workbench]:
    root = tmp_path_factory.mktemp("vscode")
    ws = root / "ws"
    ws.mkdir()
    (ws / "softmax.cu").write_text(PLANTED)
    shutil.copy(EXAMPLES / "softmax.py", ws / "softmax.py")
    for name in ("reduce_sum.cu", "reduce_sum.py"):
        shutil.copy(EXAMPLES / name, ws / name)
    (ws / "rowsum.py").write_text(TASK)
    settings = {  # the user's settings, as a user would set them
        "kernelLsp.python": sys.executable,
        "kernelLsp.arch": "sm_90",
        "kernelLsp.agent.model": "scripted-model",
        "kernelLsp.agent.baseUrl": endpoint.base_url,
        "kernelLsp.agent.budget": 2,
        "kernelLsp.proposer": "llm",
        "kernelLsp.timeout": 120,
    }
    env = {"OPENAI_API_KEY": "sk-e2e-test", "KERNEL_LSP_CACHE": str(root / "cache")}
    yield from launch(playwright, root, ws, settings, env, trust=True)


def test_planted_error_in_problems(trusted: Workbench):
    trusted.open_file("softmax.cu")
    trusted.page.keyboard.press("Control+Shift+M")
    found = poll("the planted nvcc error in Problems",
                 lambda: [p for p in trusted.problems() if 'identifier "scale" is undefined' in p], timeout=90)
    trusted.shot("problems")
    assert any(re.search(r'identifier "scale" is undefined\s+nvcc\s+\[Ln 49, Col 92\]', p) for p in found), found


def test_hover_shows_registers_and_occupancy(trusted: Workbench):
    trusted.open_file("reduce_sum.cu")
    line = next(i for i, l in enumerate((EXAMPLES / "reduce_sum.cu").read_text().splitlines(), 1)
                if "reduce_sum_kernel(" in l)
    column = (EXAMPLES / "reduce_sum.cu").read_text().splitlines()[line - 1].index("reduce_sum_kernel") + 3

    def hover() -> str:
        trusted.go_to(line, column)
        trusted.command("Show or Focus Hover")
        box = trusted.page.locator(".monaco-hover-content")
        try:
            box.first.wait_for(state="visible", timeout=5000)
        except Exception:
            return ""
        text = " ".join(box.first.inner_text().split())
        trusted.page.keyboard.press("Escape")
        return text if "registers" in text else ""

    text = poll("a hover with registers", hover, timeout=90, interval=1)
    assert "reduce_sum_kernel" in text and "Occupancy" in text, text


def test_lens_on_a_cu_with_its_harness(trusted: Workbench):
    trusted.open_file("reduce_sum.cu")
    # The lens sits above the Task's entry (the exported launcher); lenses render in view only.
    line = next(i for i, l in enumerate((EXAMPLES / "reduce_sum.cu").read_text().splitlines(), 1)
                if l.startswith('extern "C"'))
    trusted.go_to(line, 1)
    lenses = poll("kernel-lsp's lens", lambda: trusted.lenses(), timeout=60)
    trusted.shot("lens")
    joined = " | ".join(lenses)
    assert "Benchmark" in joined and "Optimize" in joined, lenses
    assert "not measured yet" in joined or "not run" in joined or "x eager" in joined, lenses


def test_optimize_from_the_palette_then_apply_from_the_diff(trusted: Workbench, endpoint):
    endpoint.add(fenced("The row loop is slow; one matrix-vector product.", FASTER))
    trusted.open_file("rowsum.py")
    trusted.command("kernel-lsp: Optimize Kernel")
    page = trusted.page
    # The verified candidate opens as a diff against the file, with Apply in its title bar.
    page.locator(".tabs-container .tab", has_text="verified candidate").wait_for(timeout=300000)
    apply = page.locator(".editor-actions .action-label[aria-label*='Apply Last Candidate']")
    apply.first.wait_for(timeout=30000)
    prompt = poll("the Apply prompt", lambda: [n for n in trusted.notifications() if "apply this verified candidate" in n],
                  timeout=30)
    trusted.shot("diff")
    assert "rowsum.py" in prompt[0], prompt
    requests = [r for r in endpoint.requests if r.get("answered")]
    assert requests, "the scripted endpoint was never asked"
    assert any("Bearer sk-e2e-test" in json.dumps(r.get("headers", {})) for r in requests)
    apply.first.click()
    page.locator(".tabs-container .tab", has_text="verified candidate").wait_for(state="detached", timeout=30000)
    trusted.open_file("rowsum.py")
    text = poll("the applied candidate in the editor", lambda: "torch.mv" in trusted.editor_text() and trusted.editor_text(),
                timeout=30)
    assert "for i in range" not in text
    # The applied text is measured again: the lens says so, then shows its numbers.
    lens = poll("the re-measured lens", lambda: [l for l in trusted.lenses() if l.startswith("correct")], timeout=180)
    assert "x eager" in lens[0] and "torch.compile" in lens[0], lens
    trusted.shot("applied")
    # The prompt is still on screen: its Apply says the candidate is in already.
    toast = page.locator(".notification-toast", has_text="apply this verified candidate")
    toast.get_by_role("button", name="Apply").click()
    poll("'applied already'", lambda: [n for n in trusted.notifications() if "applied already" in n], timeout=20)
    assert trusted.editor_text().count("torch.mv") == 1


@pytest.fixture(scope="module")
def untrusted(tmp_path_factory, playwright) -> Iterator[Workbench]:
    """A folder VS Code does not trust, whose own settings name the interpreter: VS Code
    ignores that setting there, and the default `python3` has no kernel-lsp."""
    root = tmp_path_factory.mktemp("vscode-untrusted")
    ws = root / "ws"
    (ws / ".vscode").mkdir(parents=True)
    (ws / ".vscode" / "settings.json").write_text(json.dumps({"kernelLsp.python": sys.executable}))
    (ws / "softmax.cu").write_text(PLANTED)
    settings = {"security.workspace.trust.enabled": True, "security.workspace.trust.startupPrompt": "never",
                "security.workspace.trust.banner": "always"}
    yield from launch(playwright, root, ws, settings, {}, trust=False)


def test_untrusted_workspace_says_what_to_do(untrusted: Workbench):
    untrusted.open_file("softmax.cu")
    found = poll("kernel-lsp's message", lambda: [n for n in untrusted.notifications() if "kernel-lsp" in n], timeout=60)
    untrusted.shot("untrusted")
    message = found[0]
    assert "not trusted" in message and "kernelLsp.python is ignored" in message and "python3" in message, found
    assert "Manage Workspace Trust" in message, found
    time.sleep(3)  # a crash loop would show its own messages meanwhile
    assert not [n for n in untrusted.notifications() if re.search(r"crashed|initialization failed", n, re.I)], \
        untrusted.notifications()

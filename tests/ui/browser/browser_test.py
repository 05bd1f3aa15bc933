#!/usr/bin/python3
"""The real-browser test of `remat ui` (CTest ui_browser): Debian's chromium, headless, driven over
the DevTools protocol (cdp.py). It starts `remat ui` on a free port with a temporary workspace and
does what a user does, checking each result on the page and, where the page claims something
about files, on disk:

  1. the page loads, with a form generated from the options registry;
  2. gradient checkpointing off -> the interval field is disabled, with the reason;
  3. interval 0 -> the server's error appears next to the field;
  4. interval 2 -> the predicted peak changes from the default layout's;
  5. the checkpointing help switches to Japanese (docs/OPTIONS.ja.md's text);
  6. save -> <workspace>/configs/<name>/config.json holds exactly the values typed; loading it
     back restores a field edited since; the datasets box is saved as multidatabackend.json;
  7. a 5-step run on tiny demo data -> progress reaches 5/5 and the loss chart holds 5 points
     (as many as the run's metrics.jsonl); the gallery shows the validation images it rendered;
  8. a long run stopped with the page's Stop button ends "stopped" with its checkpoint saved;
  9. bound off loopback, the page is refused without the token and works from the printed link,
     which it removes from the address bar.

A screenshot of each state goes to the output folder. Any step that does not happen fails the
test (exit 1) with a screenshot of the page as it was, and so does an uncaught JavaScript exception
or anything the server's Content-Security-Policy blocks.

Usage: browser_test.py --remat <remat binary> --source <repo root> --output <folder> [--chromium chromium]
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cdp import BrowserError, Chromium  # noqa: E402

CONFIG_NAME = "browser-test"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Check:
    """Numbered steps; each prints ok or raises."""

    def __init__(self, browser, output):
        self.browser, self.output, self.number = browser, output, 0

    def shot(self, name, selector=None):
        self.number += 1
        path = os.path.join(self.output, f"{self.number:02d}-{name}.png")
        self.browser.screenshot(path, selector)
        print(f"screenshot: {path}")

    @staticmethod
    def ok(text):
        print(f"ok: {text}", flush=True)


def start_ui(remat, workspace, port, log_path, host="127.0.0.1"):
    """`remat ui` in the background, once it answers (with 401 when it wants a token)."""
    with open(log_path, "w") as log:  # the child keeps its own descriptor
        process = subprocess.Popen([remat, "ui", "--host", host, "--port", str(port), "--workspace", workspace],
                                   stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while time.time() < deadline:
        if process.poll() is not None:
            raise BrowserError(f"remat ui exited with {process.returncode}: {open(log_path).read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/options", timeout=5):
                return process
        except urllib.error.HTTPError as e:
            if e.code == 401:
                return process
            time.sleep(0.2)
        except OSError:
            time.sleep(0.2)
    process.terminate()
    raise BrowserError("remat ui did not answer within 30 s")


def stop_ui(process):
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def check_token_mode(b, check, remat, work, output):
    """Bound off loopback, the server wants the token it prints: the page without it is refused;
    the printed link opens the page, which drops the token from the address bar and keeps using it."""
    workspace = os.path.join(work, "token-workspace")
    os.makedirs(workspace)
    port = free_port()
    log_path = os.path.join(output, "remat-ui-token.log")
    server = start_ui(remat, workspace, port, log_path, host="0.0.0.0")
    try:
        deadline = time.time() + 10
        token = None
        while token is None and time.time() < deadline:
            for line in open(log_path):
                if "?token=" in line:
                    token = line.split("?token=", 1)[1].split()[0]
            time.sleep(0.1)
        if not token:
            raise BrowserError(f"remat ui --host 0.0.0.0 printed no link with a token: {open(log_path).read()}")
        b.navigate(f"http://127.0.0.1:{port}/")
        refused = b.wait_for("document.readyState === 'complete' && document.body ? document.body.innerText : ''",
                             "the page without the token")
        if "token" not in refused or b.evaluate("document.getElementById('options-form') !== null"):
            raise BrowserError(f"the page was served without the token: {refused[:200]!r}")
        b.navigate(f"http://127.0.0.1:{port}/?token={token}")
        b.wait_for("document.body && document.body.dataset.ready === 'true'", "the page to load with the token")
        b.wait_for("document.getElementById('validation-summary').dataset.errors !== undefined",
                   "a validation (POST) with the token")
        address = b.evaluate("location.href")
        if token in address:
            raise BrowserError(f"the token stayed in the address bar: {address}")
        check.ok(f"off loopback: refused without the token; the printed link works and leaves {address}")
        check.shot("token")
    finally:
        stop_ui(server)


def cli_error_for_interval_0(remat):
    """What `remat train` itself says about --gradient_checkpointing_interval=0 (exit 2): the page
    must show the same validation, not a copy of it."""
    r = subprocess.run([remat, "train", "--gradient_checkpointing_interval=0"], capture_output=True, text=True)
    if r.returncode != 2:
        raise BrowserError(f"remat train --gradient_checkpointing_interval=0 exited {r.returncode}, want 2")
    lines = [l for l in (r.stderr + r.stdout).splitlines() if "gradient_checkpointing_interval" in l]
    if not lines:
        raise BrowserError("remat train's error does not name gradient_checkpointing_interval")
    return lines[0]


def japanese_help_snippet(source):
    """A sentence of docs/OPTIONS.ja.md's gradient_checkpointing_interval entry, read here."""
    with open(os.path.join(source, "docs", "OPTIONS.ja.md"), encoding="utf-8") as f:
        text = f.read()
    entry = text.split("### `--gradient_checkpointing_interval`", 1)[1].split("\n### ", 1)[0]
    for line in entry.splitlines():
        if line.startswith("- **") and "chunk" in line:
            body = line.split("**", 2)[2].lstrip(":： ")
            return body[:12]  # a plain-text prefix, before any inline code
    raise BrowserError("docs/OPTIONS.ja.md has no gradient_checkpointing_interval description")


def japanese_choice_label(source):
    """docs/OPTIONS.ja.md's label of gradient_checkpointing_backend's choice `torch`."""
    with open(os.path.join(source, "docs", "OPTIONS.ja.md"), encoding="utf-8") as f:
        text = f.read()
    entry = text.split("### `--gradient_checkpointing_backend`", 1)[1].split("\n### ", 1)[0]
    for line in entry.splitlines():
        if line.startswith("  - `torch`:"):
            return line.split(":", 1)[1].strip()
    raise BrowserError("docs/OPTIONS.ja.md has no label for gradient_checkpointing_backend's torch")


def as_json_value(option_type, text):
    """A value as typed -> as config.json should hold it: the registry's int and float options as
    JSON numbers, everything else (choices, paths, sizes, resolutions) as the text typed."""
    if option_type == "int":
        return int(text)
    if option_type == "float":
        return int(text) if text.isdigit() else float(text)
    return text


# The page marks the validation summary and the plan panel data-pending="true" from an edit until
# the answer for the latest edit is shown.
VALIDATION_SETTLED = "document.getElementById('validation-summary').dataset.pending === 'false'"
PLAN_SETTLED = "document.getElementById('plan-panel').dataset.pending === 'false'"


def field_value_js(name):
    return f"document.getElementById('opt-{name}')"


def run(args):
    os.makedirs(args.output, exist_ok=True)
    for old in os.listdir(args.output):
        if old.endswith(".png"):
            os.remove(os.path.join(args.output, old))
    work = tempfile.mkdtemp(prefix="remat-ui-browser-")
    workspace = os.path.join(work, "workspace")
    os.makedirs(workspace)
    server = None
    browser = None
    check = None
    try:
        # The demo data, tiny: a Flux pipeline folder (flux-tiny) and captioned pictures, as `make
        # demo` makes them, inside the workspace. The run caches them and renders validation images.
        for command in (["make-demo-pipeline", "--output", os.path.join(workspace, "pipe")],
                        ["make-demo-images", "--output", os.path.join(workspace, "pics"), "--count", "4",
                         "--size", "32"]):
            subprocess.run([args.remat] + command, check=True, stdout=subprocess.DEVNULL)
        interval_error = cli_error_for_interval_0(args.remat)
        ja_snippet = japanese_help_snippet(args.source)
        ja_label = japanese_choice_label(args.source)

        port = free_port()
        server = start_ui(args.remat, workspace, port, os.path.join(args.output, "remat-ui.log"))
        browser = Chromium(args.chromium, width=1280, height=900)
        check = Check(browser, args.output)
        b = browser

        # 1. The page and its generated form.
        b.navigate(f"http://127.0.0.1:{port}/")
        b.wait_for("document.body && document.body.dataset.ready === 'true'", "the page to load the registry")
        n_fields = b.evaluate("document.querySelectorAll('.field').length")
        n_sections = b.evaluate("document.querySelectorAll('fieldset.section').length")
        registry = json.loads(subprocess.run([args.remat, "options", "--json"], capture_output=True, text=True,
                                             check=True).stdout)
        want_fields = len([d for d in registry["$defs"].values() if "x-remat" in d])
        want_sections = len({d["x-remat"]["section"] for d in registry["$defs"].values() if "x-remat" in d})
        if n_fields != want_fields or n_sections != want_sections:
            raise BrowserError(f"form has {n_fields} fields in {n_sections} sections; the registry has "
                               f"{want_fields} options in {want_sections} sections")
        b.wait_for("document.getElementById('validation-summary').dataset.errors !== undefined",
                   "the first validation")
        check.ok(f"page loaded: {n_fields} fields in {n_sections} sections, as the registry")
        check.shot("loaded")

        # The run's model and data, typed as a user would (the planner's figures in steps 2-4 are
        # for this model: flux-tiny, as the demo pipeline's transformer).
        typed = {
            "model_flavour": "flux-tiny", "model_type": "lora", "lora_rank": "2", "pretrained_model_name_or_path": "pipe",
            "instance_data_dir": "pics", "caption_strategy": "textfile", "cache_dir": "cache",
            "resolution": "32", "resolution_type": "pixel", "output_dir": "output/browser-test",
            "max_train_steps": "5", "train_batch_size": "1", "learning_rate": "0.001", "mixed_precision": "no",
            "report_every": "1", "torch_num_threads": "1", "checkpoint_step_interval": "5",
            "validation_prompt": "a red square", "validation_step_interval": "5", "validation_resolution": "32",
            "validation_num_inference_steps": "4",
        }
        for name, value in typed.items():
            if b.evaluate(f"{field_value_js(name)}.tagName") == "SELECT":
                b.choose(f"#opt-{name}", value)
            else:
                b.type_into(f"#opt-{name}", value)
        # 2. Gradient checkpointing off: the interval field is disabled, with the reason.
        b.click("#opt-gradient_checkpointing")
        b.wait_for(f"{field_value_js('gradient_checkpointing')}.checked === false", "the checkbox to clear")
        b.wait_for(f"{field_value_js('gradient_checkpointing_interval')}.disabled === true",
                   "the interval field to be disabled")
        reason = b.wait_for("(() => { const r = document.querySelector('[data-reason-for=gradient_checkpointing_interval]');"
                            " return r && !r.classList.contains('hidden') && r.offsetParent !== null ? r.textContent : ''; })()",
                            "the reason shown next to the disabled interval field")
        if "gradient_checkpointing" not in reason:
            raise BrowserError(f"the reason does not name gradient_checkpointing: {reason!r}")
        check.ok(f"checkpointing off -> interval disabled: {reason}")
        check.shot("checkpointing-off", "#section-gradient-checkpointing")

        # Back on; the default layout's predicted peak is the reference for step 4.
        b.click("#opt-gradient_checkpointing")
        b.wait_for(f"{field_value_js('gradient_checkpointing_interval')}.disabled === false",
                   "the interval field to be enabled again")
        peak_default = int(b.wait_for(PLAN_SETTLED + " && document.getElementById('plan-peak').dataset.bytes",
                                      "the predicted peak of the default layout", timeout=60))

        # 3. Interval 0: the server's error next to the field.
        b.type_into("#opt-gradient_checkpointing_interval", "0")
        shown = b.wait_for("document.getElementById('msgs-gradient_checkpointing_interval').textContent",
                           "an error next to the interval field")
        if "gradient_checkpointing_interval" not in shown or not b.evaluate(
                "document.querySelector('#msgs-gradient_checkpointing_interval .msg.error') !== null"):
            raise BrowserError(f"the message next to the field is not the interval's error: {shown!r}")
        # The CLI's own message, with its "[tag] " prefix and option name as printed.
        core = interval_error.split("must be", 1)[-1].strip()[:20]
        if core and core not in shown:
            raise BrowserError(f"the page's error {shown!r} is not the CLI's {interval_error!r}")
        check.ok(f"interval 0 -> error next to the field: {shown}")
        check.shot("interval-0-error", "#field-gradient_checkpointing_interval")

        # 4. Interval 2: the error goes, the predicted peak changes.
        b.type_into("#opt-gradient_checkpointing_interval", "2")
        b.wait_for("document.getElementById('msgs-gradient_checkpointing_interval').textContent === ''",
                   "the interval error to clear")
        b.wait_for(PLAN_SETTLED, "the plan of interval 2", timeout=60)
        peak_2 = int(b.evaluate("document.getElementById('plan-peak').dataset.bytes") or 0)
        if not peak_2 or peak_2 == peak_default:
            raise BrowserError(f"the predicted peak did not change: {peak_default} bytes (default layout) -> "
                               f"{peak_2} (interval 2)")
        check.ok(f"interval 2 -> predicted peak {peak_default} -> {peak_2} bytes")
        check.shot("interval-2-peak", "#section-gradient-checkpointing")

        # 5. The checkpointing help in Japanese (the docs' translation).
        b.choose("#help-language", "ja")
        b.wait_for(f"document.querySelector('[data-help-for=gradient_checkpointing_interval]').textContent"
                   f".includes({json.dumps(ja_snippet)})", "the interval's help in Japanese")
        b.wait_for(f"document.querySelector('[data-help-for=gradient_checkpointing_backend]').textContent"
                   f".includes({json.dumps(ja_label)})", "the backend's choice labels in Japanese")
        check.ok(f"help in Japanese: ...{ja_snippet}..., torch: {ja_label}")
        check.shot("help-japanese", "#section-gradient-checkpointing")
        b.choose("#help-language", "en")

        # 6. Save and compare config.json with what was typed.
        b.type_into("#config-name", CONFIG_NAME)
        b.wait_for(VALIDATION_SETTLED, "the validation of the typed config", timeout=30)
        errors = b.evaluate("document.getElementById('validation-summary').dataset.errors")
        if errors != "0":
            raise BrowserError(f"the typed config has {errors} errors: "
                               + b.evaluate("[...document.querySelectorAll('.msg.error')].map(m => m.textContent).join('; ')"))
        b.click("#save-config")
        saved_path = os.path.join(workspace, "configs", CONFIG_NAME, "config.json")
        b.wait_for("document.getElementById('status').textContent.startsWith('saved')", "the save to finish")
        with open(saved_path) as f:
            saved = json.load(f)
        if "config" in saved and isinstance(saved["config"], dict):
            raise BrowserError("config.json is wrapped in {config: ...}; it must be SimpleTuner's flat form")
        want = {"gradient_checkpointing": True, "gradient_checkpointing_interval": 2}
        for name, value in typed.items():
            want[name] = as_json_value(registry["$defs"][name]["x-remat"]["optionType"], value)
        if saved != want:
            raise BrowserError(f"saved config.json differs:\n saved {json.dumps(saved, sort_keys=True)}\n"
                               f" typed {json.dumps(want, sort_keys=True)}")
        check.ok(f"saved {saved_path}: the {len(want)} values typed, nothing else")
        check.shot("saved")
        # Loading it back undoes an unsaved edit.
        b.type_into("#opt-gradient_checkpointing_interval", "3")
        b.choose("#load-config", CONFIG_NAME)
        b.wait_for(f"{field_value_js('gradient_checkpointing_interval')}.value === '2'",
                   "loading the saved config to restore interval 2")
        check.ok("loaded the saved config back: interval 2 again")
        # The datasets box: saved as multidatabackend.json beside config.json, which points at it.
        datasets = [{"id": "pics", "type": "local", "instance_data_dir": "pics", "caption_strategy": "textfile"}]
        b.click("#datasets summary")
        b.type_into("#config-name", CONFIG_NAME + "-datasets")
        b.type_into("#multidatabackend", json.dumps(datasets))
        b.click("#save-config")
        b.wait_for("document.getElementById('status').textContent.startsWith('saved')", "the save with datasets")
        folder = os.path.join(workspace, "configs", CONFIG_NAME + "-datasets")
        with open(os.path.join(folder, "multidatabackend.json")) as f:
            saved_datasets = json.load(f)
        with open(os.path.join(folder, "config.json")) as f:
            pointer = json.load(f).get("data_backend_config")
        if saved_datasets != datasets or pointer != f"configs/{CONFIG_NAME}-datasets/multidatabackend.json":
            raise BrowserError(f"datasets saved as {saved_datasets}, data_backend_config {pointer!r}")
        b.choose("#load-config", CONFIG_NAME)
        b.wait_for("document.getElementById('multidatabackend').value === ''"
                   f" && document.getElementById('config-name').value === {json.dumps(CONFIG_NAME)}",
                   "loading the config without datasets")
        check.ok("datasets box saved as multidatabackend.json, config.json's data_backend_config points at it")

        # 7. A 5-step run: progress to the end, 5 points on the chart.
        b.click("#start-run")
        b.wait_for("!document.getElementById('view-runs').classList.contains('hidden')", "the run view")
        state = b.wait_for("(() => { const s = document.getElementById('run-state').dataset.state;"
                           " return s && s !== 'running' ? s : ''; })()", "the run to end", timeout=240)
        step = b.evaluate("document.getElementById('run-step').dataset.step")
        maximum = b.evaluate("document.getElementById('run-step').dataset.max")
        bar = b.evaluate("[document.getElementById('run-progress').value, document.getElementById('run-progress').max]")
        if state != "finished" or step != "5" or maximum != "5" or bar != [5, 5]:
            log = b.evaluate("document.getElementById('log-tail').textContent")[-1500:]
            raise BrowserError(f"run ended {state} at step {step}/{maximum} (bar {bar}); log tail:\n{log}")
        points = b.wait_for("(() => { const n = document.querySelectorAll('#loss-chart svg circle.point').length;"
                            " return n >= 5 ? n : 0; })()", "5 points on the loss chart")
        output_dir = b.evaluate("document.getElementById('run-output').textContent")
        metrics_path = os.path.join(output_dir if os.path.isabs(output_dir) else os.path.join(workspace, output_dir),
                                    "metrics.jsonl")
        with open(metrics_path) as f:
            records = [json.loads(l) for l in f if l.strip()]
        if points != 5 or len(records) != 5:
            raise BrowserError(f"chart has {points} points, metrics.jsonl {len(records)} records; want 5 and 5")
        check.ok(f"run finished: progress {step}/{maximum}, chart {points} points = metrics.jsonl's {len(records)}")
        # The validation gallery: every picture the run rendered, loaded.
        pictures = sorted(n for n in os.listdir(os.path.join(os.path.dirname(metrics_path), "validation_images"))
                          if n.endswith(".png"))
        if not pictures:
            raise BrowserError("the run rendered no validation images")
        shown = b.wait_for(f"(() => {{ const imgs = [...document.querySelectorAll('#gallery img')];"
                           f" return imgs.length === {len(pictures)} && imgs.every(i => i.complete && i.naturalWidth > 0)"
                           f" ? imgs.map(i => i.alt).sort() : null; }})()", f"the {len(pictures)} validation images")
        if shown != pictures:
            raise BrowserError(f"the gallery shows {shown}, the run wrote {pictures}")
        check.ok(f"validation gallery: {len(pictures)} pictures, as in validation_images/")
        check.shot("run-finished")

        # 8. A long run stopped from the page: SIGINT, and its checkpoint is saved.
        b.click("#tab-configure")
        b.type_into("#config-name", CONFIG_NAME + "-stop")
        b.type_into("#opt-max_train_steps", "100000")
        b.type_into("#opt-output_dir", "output/browser-stop")
        b.type_into("#opt-validation_prompt", "")
        b.wait_for(VALIDATION_SETTLED + " && document.getElementById('validation-summary').dataset.errors === '0'",
                   "the long run's config to validate", timeout=30)
        b.click("#start-run")
        b.wait_for("document.getElementById('run-output').textContent.endsWith('browser-stop')"
                   " && Number(document.getElementById('run-step').dataset.step) >= 2", "the long run's second step",
                   timeout=120)
        b.click("#stop-run")
        state = b.wait_for("(() => { const s = document.getElementById('run-state').dataset.state;"
                           " return s && s !== 'running' ? s : ''; })()", "the stopped run to end", timeout=120)
        stopped_at = int(b.evaluate("document.getElementById('run-step').dataset.step"))
        shown = b.evaluate("document.getElementById('run-checkpoints').textContent")
        stop_dir = os.path.join(workspace, "output", "browser-stop")
        on_disk = sorted(n for n in os.listdir(stop_dir) if n.startswith("checkpoint-"))
        if state != "stopped" or f"checkpoint-{stopped_at}" not in on_disk or f"checkpoint-{stopped_at}" not in shown:
            raise BrowserError(f"stop: state {state}, step {stopped_at}, page shows checkpoints {shown!r}, "
                               f"disk has {on_disk}")
        check.ok(f"stopped at step {stopped_at}: state {state}, checkpoint-{stopped_at} saved and shown")
        check.shot("run-stopped")

        violations = b.evaluate("window.__cspViolations")
        if violations:
            raise BrowserError(f"the server's Content-Security-Policy blocked: {violations}")

        # 9. Off loopback: the token.
        check_token_mode(b, check, args.remat, work, args.output)

        if b.exceptions:
            raise BrowserError("uncaught JavaScript exceptions on the page: " + "; ".join(b.exceptions[:5]))
        print("PASS: every state reached; screenshots in", args.output)
        return 0
    except Exception as e:  # noqa: BLE001 - any failure is a test failure, with the page's picture
        print(f"FAIL: {e}", file=sys.stderr)
        traceback.print_exc()
        if browser is not None:
            try:
                browser.screenshot(os.path.join(args.output, "failure.png"))
                print("JS exceptions:", browser.exceptions, "console errors:", browser.console_errors, file=sys.stderr)
            except Exception:
                pass
        return 1
    finally:
        if browser is not None:
            browser.close()
        if server is not None:
            stop_ui(server)
        shutil.rmtree(work, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--remat", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--chromium", default="chromium")
    return run(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())

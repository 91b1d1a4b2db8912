"""The demo image and the Space header, checked by reading them (no Docker engine is needed).

Docker Spaces run the container as uid 1000, route traffic to ``app_port`` and watch the health
endpoint; the demo must switch on the app's demo limits and install like a workstation.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "Dockerfile"
SPACE_README = ROOT / "docs" / "SPACE_README.md"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


@pytest.fixture(scope="module")
def steps() -> list[tuple[str, str]]:
    assert DOCKERFILE.exists(), "the demo needs a Dockerfile at the repository root"
    return instructions(DOCKERFILE.read_text())


def args_of(steps, keyword: str) -> list[str]:
    return [rest for key, rest in steps if key == keyword]


def env_of(steps) -> dict[str, str]:
    env = {}
    for rest in args_of(steps, "ENV"):
        for item in shlex.split(rest):
            key, _, value = item.partition("=")
            env[key] = value
    return env


def test_parser_joins_continuations_and_drops_comments():
    parsed = instructions("# c\nFROM x:1\nRUN a \\\n    && b\n\nENV A=1 \\\n  B=2\n")
    assert parsed == [("FROM", "x:1"), ("RUN", "a      && b"), ("ENV", "A=1    B=2")]


def test_base_image_is_pinned_python(steps):
    (base,) = args_of(steps, "FROM")
    assert re.fullmatch(r"python:3\.\d+[-\w.]*", base), base
    assert ":latest" not in base


def test_runs_as_uid_1000(steps):
    users = [rest for rest in args_of(steps, "RUN") if "useradd" in rest]
    assert users and re.search(r"useradd\b.*-u 1000\b.*\buser\b", users[0])
    assert args_of(steps, "USER")[-1] in ("user", "1000")
    keys = [key for key, _ in steps]
    assert keys.index("USER") < keys.index("COPY"), "copy and install as the user, not as root"
    assert all("--chown=user" in rest for rest in args_of(steps, "COPY"))
    assert args_of(steps, "WORKDIR")[-1] in ("$HOME/app", "/home/user/app")
    made = [i for i, (key, rest) in enumerate(steps) if key == "RUN" and "mkdir -p $HOME/app" in rest]
    assert made and keys.index("USER") < made[0] < keys.index("WORKDIR"), "the app folder must be the user's"


def test_installs_with_the_project_script(steps):
    installs = [rest for rest in args_of(steps, "RUN") if "scripts/install.sh" in rest]
    assert installs and "bash scripts/install.sh" in installs[0]
    assert (ROOT / "scripts" / "install.sh").exists()
    assert "torch==" in (ROOT / "scripts" / "install.sh").read_text()
    assert "download.pytorch.org/whl/cpu" in installs[0], "the CPU build of torch on a CPU Space"
    assert not any(re.search(r"\bpip3? install\b", rest) for rest in args_of(steps, "RUN")
                   if "install.sh" not in rest), "one way to install: scripts/install.sh"


def test_demo_mode_and_offline(steps):
    env = env_of(steps)
    assert env.get("GHOSTED_DEMO") == "1"
    assert env.get("HF_HUB_OFFLINE") == "1"
    from ghosted.service.deploy import from_env

    assert from_env({"GHOSTED_DEMO": env["GHOSTED_DEMO"]}).name == "demo"  # the app reads it so


def test_upload_limit_matches_the_demo_preset(steps):
    from ghosted.service.deploy import DEMO

    assert float(env_of(steps)["STREAMLIT_SERVER_MAX_UPLOAD_SIZE"]) == DEMO.max_upload_mb


def test_serves_streamlit_on_8501_with_a_health_check(steps):
    assert args_of(steps, "EXPOSE") == ["8501"]
    (health,) = args_of(steps, "HEALTHCHECK")
    assert re.search(r"CMD curl --fail http://localhost:8501/_stcore/health", health)
    assert any("curl" in rest for rest in args_of(steps, "RUN") if "apt-get install" in rest)
    (cmd,) = args_of(steps, "CMD")
    command = json.loads(cmd)  # exec form: signals reach streamlit
    assert command[:3] == ["streamlit", "run", "app.py"]
    assert "--server.port=8501" in command and "--server.address=0.0.0.0" in command
    assert (ROOT / "app.py").exists()
    assert "/home/user/app/.venv/bin" in env_of(steps)["PATH"]


def test_bundled_model_is_prepared_at_build_time_without_a_gpu(steps):
    warm = [rest for rest in args_of(steps, "RUN") if "load_model" in rest]
    assert warm and "device='cpu'" in warm[0]
    assert not any("cuda" in rest or "nvidia" in rest for rest in args_of(steps, "RUN"))


def test_the_shared_store_is_precomputed_at_build_time_in_demo_mode(steps):
    keys = [key for key, _ in steps]
    runs = [i for i, (key, rest) in enumerate(steps) if key == "RUN" and "scripts/precompute.py" in rest]
    assert runs, "the image answers the page defaults at once: RUN python scripts/precompute.py"
    demo = next(i for i, (key, rest) in enumerate(steps) if key == "ENV" and "GHOSTED_DEMO=1" in rest)
    assert keys.index("COPY") < demo < runs[0], "after the code is copied, with the demo's limits"
    assert (ROOT / "scripts" / "precompute.py").exists()


def test_dockerignore_keeps_the_local_environment_out():
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    assert ".venv/" in ignored and ".git/" in ignored
    for needed in ("app.py", "pages/", "assets/", "ghosted/", "scripts/", "requirements.txt", ".streamlit/"):
        assert needed not in ignored and (ROOT / needed).exists(), needed


def front_matter(text: str) -> dict[str, str]:
    """Top-level ``key: value`` pairs of a README's YAML header (lists are kept as raw text)."""
    match = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert match, "the Space README must start with a --- YAML header ---"
    pairs = {}
    for line in match.group(1).splitlines():
        if re.match(r"^[A-Za-z_]+:", line):
            key, _, value = line.partition(":")
            pairs[key] = value.strip().strip("'\"")
    return pairs


def test_space_header(steps):
    header = front_matter(SPACE_README.read_text())
    assert header["sdk"] == "docker"
    assert header["app_port"] == args_of(steps, "EXPOSE")[0] == "8501"
    assert header["suggested_hardware"] == "cpu-basic"
    assert header["title"] and header["emoji"]
    assert 0 < len(header["short_description"]) <= 60  # the hub's limit


def test_deploy_doc_states_the_plan_limits():
    text = (ROOT / "docs" / "DEPLOY.md").read_text()
    for fact in ("PRO", "ZeroGPU is Gradio-only", "CPU basic", "docker run", "docker build",
                 "SPACE_README.md"):
        assert fact in text, fact

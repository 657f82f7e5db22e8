# The two commands: `make run` (the main job on the embedded digits data) and
# `make test` (the test suite). Each creates .venv on a fresh machine first.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
OUT ?= results/make-run

.PHONY: run test test-fast bench bench-quick bench-models bench-user-models bench-fuzz bench-fuzz-signal bench-fuzz-pooling bench-fuzz-misses bench-chaos test-secagg-deployed bench-secure-aggregation clean test-containers test-arm64 test-compat constraints check-report

# pyproject.toml holds ranges; constraints.txt the exact versions make test and CI install.
$(VENV)/.installed: pyproject.toml constraints.txt
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (constraints.txt is frozen on Python 3.11)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]" -c constraints.txt
	touch $@

# Freeze .venv into constraints.txt (after upgrading a package within pyproject's ranges, e.g.
# `.venv/bin/pip install -U "flwr[simulation]==1.42.0"`, and `make test`). CUDA torch and its
# libraries are x86_64 wheels: their lines carry a marker so an aarch64 machine resolves its own.
constraints:
	{ echo "# Exact versions for make test and CI (pip install -c constraints.txt); written by make constraints."; \
	  $(PY) -m pip freeze --exclude-editable | grep -v '^#' \
	  | sed -E 's/^((torch|torchvision|triton|nvidia-[a-z0-9-]+|cuda-[a-z0-9-]+)==.*)$$/\1; platform_machine != "aarch64"/'; \
	} > constraints.txt

# The library, client-helper and example tests on the newest Flower here and on the lowest
# supported one, each in its own venv (.venv-compat-<version>) with CPU torch; ~10 min each the
# first time. Then the same tests on Flower's next release, the newest flwr-nightly on the index
# (resolved at run time, .venv-compat-nightly): that lane may fail without failing the target,
# but prints "== flwr-nightly <version>: FAILED (allowed)" with the failing tests, and a summary
# line closes the run. COMPAT_NIGHTLY=0 skips it; COMPAT_FLOWER=nightly runs it alone.
# COMPAT_TORCH / COMPAT_PIP_ARGS: see scripts/test-compat.sh.
COMPAT_FLOWER ?= 1.42.0 1.41.0 nightly
COMPAT_NIGHTLY ?= 1
test-compat:
	PYTHON=$(PYTHON) COMPAT_NIGHTLY=$(COMPAT_NIGHTLY) scripts/test-compat.sh $(COMPAT_FLOWER)

# FedClust beside FedAvg on scikit-learn's digits, 20 clients in 5 groups of digit
# pairs, on Flower's simulation engine.
run: $(VENV)/.installed
	$(VENV)/bin/clusterfed compare --engine flower --strategies fedavg,fedclust --out $(OUT) \
		--set rounds=20 --set partitioner=label-groups --set label-groups="0,1;2,3;4,5;6,7;8,9"

# The whole suite on TEST_WORKERS processes (pytest-xdist; auto = one per core), each test file
# whole on one process (--dist loadfile: a file's module-scoped runs are made once). Every test
# runs, as with a plain `pytest tests`, which is what TEST_WORKERS=0 does.
TEST_WORKERS ?= auto
test: $(VENV)/.installed
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile tests

# The fast tier: the unit and fast integration tests. It leaves out the tests marked end_to_end
# (pyproject.toml's markers): runs on Flower's simulation engine, deployments on loopback,
# SuperLink/SuperNode/ServerApp processes, docker checks, model matrices and long golden runs.
# `make test` (and CI) runs every test, those included.
test-fast: $(VENV)/.installed
	$(PY) -m pytest -m "not end_to_end" tests

# Every strategy on every setting (benchmarks/experiments/suite-*.toml), FedClust's λ sweep
# (lambda-sensitivity*.toml), then docs/results.md, docs/fidelity.md and the README's results
# summary regenerated from the files (benchmarks/report.py). Each result folder gets a
# manifest.json (commit, config hash, versions, machine). Wall times: the folders' timing.json.
BENCH_WORKERS ?= 2
EXPERIMENTS := benchmarks/experiments

bench: $(VENV)/.installed
	$(VENV)/bin/clusterfed experiment $(EXPERIMENTS)/suite-full.toml --workers $(BENCH_WORKERS)
	$(VENV)/bin/clusterfed experiment $(EXPERIMENTS)/lambda-sensitivity.toml --workers $(BENCH_WORKERS)
	$(PY) benchmarks/report.py

bench-quick: $(VENV)/.installed
	$(VENV)/bin/clusterfed experiment $(EXPERIMENTS)/suite-quick.toml --workers $(BENCH_WORKERS)
	$(VENV)/bin/clusterfed experiment $(EXPERIMENTS)/lambda-sensitivity-quick.toml --workers $(BENCH_WORKERS)
	$(PY) benchmarks/report.py

# Users' own models (MLP, BatchNorm ResNet, GRU, Transformer, 0-d buffer, float16, the
# quickstart-pytorch client) × concept/covariate shift × every clustered strategy, with stock
# ClientApps: benchmarks/results/model-matrix/ (table, heatmaps, manifest; ~10 min on one core).
bench-models: $(VENV)/.installed
	$(PY) benchmarks/model_matrix.py

# Only the models written as outside users write them (MobileNetV2-style, a frozen backbone, a
# head before an auxiliary decoder, an LSTM, the quickstart client at lr 0.1), into
# USER_MODELS_OUT, its README with a before -> after table against the committed before run.
USER_MODELS_OUT ?= benchmarks/results/model-matrix-user-models/after
bench-user-models: $(VENV)/.installed
	$(PY) benchmarks/model_matrix.py --models user --out $(USER_MODELS_OUT) --before benchmarks/results/model-matrix-user-models/before

# Every strategy on models and data drawn at random (benchmarks/model_fuzz.py): FUZZ_SEEDS
# (development: 0-999; the held-out range 1000- needs --held-out and is run once, at the end)
# into FUZZ_OUT; a cell already there keeps its rows, only the strategies it lacks run
# (~3-5 min a cell on two busy cores).
FUZZ_SEEDS ?= 0-9
FUZZ_OUT ?= benchmarks/results/model-fuzz/dev
bench-fuzz: $(VENV)/.installed
	PYTHONPATH=$(CURDIR) nice -n 10 $(PY) benchmarks/model_fuzz.py --seeds $(FUZZ_SEEDS) --out $(FUZZ_OUT)

# How far the same cells' true groups show in the clients' updates at all (benchmarks/group_signal.py;
# ~1 min a cell): into FUZZ_SIGNAL_OUT, beside the strategies' rows of FUZZ_OUT
FUZZ_SIGNAL_OUT ?= benchmarks/results/model-fuzz/group-signal
bench-fuzz-signal: $(VENV)/.installed
	PYTHONPATH=$(CURDIR) nice -n 10 $(PY) benchmarks/group_signal.py --seeds $(FUZZ_SEEDS) --out $(FUZZ_SIGNAL_OUT) --judged $(FUZZ_OUT)

# Whether a client's updates pooled over its rounds show the true groups better than its latest
# (benchmarks/update_pooling.py): 30 half-participation label-swap and rotation cells drawn at
# random from the development seeds; minutes
POOLING_SEEDS = 18,56,93,148,162,173,208,293,312,318,321,383,388,461,475,650,657,675,694,742,768,773,854,910,927,936,963,968,995,996
bench-fuzz-pooling: $(VENV)/.installed
	PYTHONPATH=$(CURDIR) nice -n 10 $(PY) benchmarks/update_pooling.py --seeds $(POOLING_SEEDS) --out benchmarks/results/model-fuzz/dev-update-pooling

# Why the clustered strategies miss, pooled over every held-out folder and its signal record
# (benchmarks/fuzz_misses.py: reads the committed cell records, runs no cell; seconds)
# the held-out ranges' strategy folders: those with cell records (not the code before, not a
# trial's rows on a spent range)
FUZZ_HELD_OUT = $(sort $(filter-out %-before,$(patsubst %/cells/,%,$(wildcard benchmarks/results/model-fuzz/held-out*/cells/))))
bench-fuzz-misses: $(VENV)/.installed
	PYTHONPATH=$(CURDIR) $(PY) benchmarks/fuzz_misses.py --folders $(FUZZ_HELD_OUT) \
		--signal $(sort $(wildcard benchmarks/results/model-fuzz/held-out*-signal)) \
		--out benchmarks/results/model-fuzz/held-out-misses

# A chaos soak on 127.0.0.1 (TLS, SuperNode authentication): CHAOS_NODES SuperNodes, FedClust
# and CFL for CHAOS_ROUNDS rounds under SuperNode kills, two SuperLink kills (resume-from =
# "auto") and a device whose data turns bad, against a clean run of the same seed:
# benchmarks/results/chaos-soak/ (summary.json, figure, manifest; ~40 min on two busy cores).
CHAOS_NODES ?= 12
CHAOS_ROUNDS ?= 6
CHAOS_KILL_EVERY ?= 1
bench-chaos: $(VENV)/.installed
	PYTHONPATH=$(CURDIR):$(CURDIR)/tests PATH=$(abspath $(VENV))/bin:$$PATH nice -n 10 $(PY) benchmarks/bench_chaos_soak.py \
		--nodes $(CHAOS_NODES) --rounds $(CHAOS_ROUNDS) --kill-every $(CHAOS_KILL_EVERY) --out benchmarks/results/chaos-soak

# Secure aggregation deployed (127.0.0.1, TLS, SuperNode authentication): SECAGG_NODES SuperNodes,
# FedClust with SecAgg+ inside each cluster for SECAGG_ROUNDS rounds; one SuperNode holds the
# ask to upload its masked vector in round SECAGG_KILL_ROUND (after the key exchange) and is
# SIGKILLed there; the round must finish from the survivors and the run must end with the
# clusters and accuracy of a clean in-process run: benchmarks/results/secure-aggregation/deployed/
# (summary.json, the ServerApp's log, manifest; ~15-25 min on two busy cores). Fails unless
# every check passes.
SECAGG_NODES ?= 8
SECAGG_ROUNDS ?= 5
SECAGG_KILL_ROUND ?= 3
test-secagg-deployed: $(VENV)/.installed
	PYTHONPATH=$(CURDIR):$(CURDIR)/tests PATH=$(abspath $(VENV))/bin:$$PATH nice -n 10 $(PY) benchmarks/bench_secagg_deployed.py \
		--nodes $(SECAGG_NODES) --rounds $(SECAGG_ROUNDS) --kill-round $(SECAGG_KILL_ROUND) \
		--out benchmarks/results/secure-aggregation/deployed

# What secure aggregation costs a run, plain vs SecAgg+ as ratios measured back to back: bytes
# each way and seconds per round, FedAvg (one global group) and FedClust (a group per cluster),
# 12 and 100 clients, with final accuracy and ARI: benchmarks/results/secure-aggregation/
# (summary.json, runs.json, manifest; in-process engine).
bench-secure-aggregation: $(VENV)/.installed
	PYTHONPATH=$(CURDIR):$(CURDIR)/tests nice -n 10 $(PY) benchmarks/bench_secure_aggregation.py \
		--out benchmarks/results/secure-aggregation

# Real checks outside `make test` (root on Debian 12 x86_64; each installs what it needs with
# apt and pip and caches under /var/cache/clusterfed). test-containers: docker/preflight.sh first,
# then docker/'s images built with podman and the compose federation (6 devices,
# docker/prepare.sh) run plain and with TLS, every service killed and back, FedClust recovering
# from crashes and a SuperLink stop/start mid-run, then a short soak run by the keeper service
# (6 rounds, ~15 min); it needs no torch on the host (its own small venv under the cache),
# changes no system file and writes benchmarks/results/containers/ only when every step passed;
# test-arm64: an emulated aarch64 device (qemu-user) installs the device part and joins one round
# (~40 min the first time). Results: benchmarks/results/{containers,arm64}/.
test-containers:
	scripts/test-containers.sh

test-arm64: $(VENV)/.installed
	CLUSTERFED_VENV=$(abspath $(VENV)) scripts/test-arm64.sh

# The HTML run report of a short FedClust run (20 clients, 8 rounds, every log-to destination
# installed) checked for self-containment and rendered in headless Chromium (installed with
# apt when missing): benchmarks/results/report/ (report.html, screenshot.png, result.json,
# manifest.json; ~2 min).
check-report: $(VENV)/.installed
	command -v chromium >/dev/null || { apt-get update && apt-get install -y chromium; }
	$(PY) benchmarks/check_report.py

clean:
	rm -rf $(VENV) results .pytest_cache

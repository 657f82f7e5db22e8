"""The task: logistic regression on a station's sensor readings, where what a reading means
depends on the site.

The data is generated (no download). Each device is a weather station that turns 6 readings
into one of three alerts. Readings fall near one of three patterns (calm, storm front, heat);
which alert a pattern calls for depends on the kind of site the station watches (harbour,
orchard, ski slope): a storm front closes a harbour but is only a notice for a ski slope. One
model for all stations cannot be right everywhere; one model per kind of site can.
"""

import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression

ALERTS = ("none", "notice", "close")
PATTERNS = ("calm", "storm front", "heat")
SITES = ("harbour", "orchard", "ski slope")
# MEANING[site][pattern] = the alert that pattern calls for at that kind of site
MEANING = ((0, 2, 1),  # harbour: a storm front closes it, heat is a notice
           (1, 0, 2),  # orchard: calm (no wind for frost protection) is a notice, heat closes it
           (2, 1, 0))  # ski slope: calm days are closed (no snow made), a front is a notice
NUM_FEATURES = 6
CENTRES = np.random.default_rng(1234).normal(0.0, 2.0, size=(len(PATTERNS), NUM_FEATURES))


def group_of(partition_id: int) -> int:
    """The kind of site of station `partition_id` (for the ARI only; no algorithm reads it)."""
    return partition_id % len(SITES)


def load_data(partition_id: int, num_samples: int = 90, test_fraction: float = 0.3):
    """(x_train, y_train, x_test, y_test) of one station, seeded by its partition id."""
    rng = np.random.default_rng(partition_id)
    pattern = np.arange(num_samples) % len(PATTERNS)  # every pattern, so every alert, on every station
    x = CENTRES[pattern] + rng.normal(0.0, 1.0, size=(num_samples, NUM_FEATURES))
    y = np.asarray(MEANING[group_of(partition_id)])[pattern]
    order = rng.permutation(num_samples)
    x, y = x[order], y[order].astype(np.int64)  # float64: the model's arrays keep one dtype end to end
    cut = int(num_samples * (1 - test_fraction))
    return x[:cut], y[:cut], x[cut:], y[cut:]


# The arrays travel under a layer's names, as in a torch state dict (coef_ is the linear layer's
# weight, intercept_ its bias): clustered strategies pick the layers they compare by these names.
WEIGHT, BIAS = "linear.weight", "linear.bias"


def initial_arrays() -> dict[str, np.ndarray]:
    """The model's parameters before training: zeros (logistic regression needs no random start)."""
    return {WEIGHT: np.zeros((len(ALERTS), NUM_FEATURES)), BIAS: np.zeros(len(ALERTS))}


def model_with(arrays: dict[str, np.ndarray], max_iter: int = 1) -> LogisticRegression:
    """A LogisticRegression holding `arrays`, ready to predict or to go on training from them."""
    model = LogisticRegression(max_iter=max_iter, warm_start=True)  # warm_start: fit starts from coef_
    model.classes_ = np.arange(len(ALERTS))
    model.coef_ = np.array(arrays[WEIGHT], dtype=np.float64)
    model.intercept_ = np.array(arrays[BIAS], dtype=np.float64)
    return model


def train(arrays: dict[str, np.ndarray], x, y, epochs: int) -> tuple[dict[str, np.ndarray], float]:
    """`epochs` L-BFGS iterations from `arrays`; the new arrays and the training log-loss."""
    model = model_with(arrays, max_iter=epochs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # a few iterations per round, by design
        model.fit(x, y)
    trained = {WEIGHT: model.coef_.copy(), BIAS: model.intercept_.copy()}
    return trained, evaluate(trained, x, y)[0]


def evaluate(arrays: dict[str, np.ndarray], x, y) -> tuple[float, float]:
    """(log-loss, accuracy) of the model `arrays` on (x, y)."""
    from sklearn.metrics import log_loss

    model = model_with(arrays)
    probabilities = model.predict_proba(x)
    return float(log_loss(y, probabilities, labels=model.classes_)), float((probabilities.argmax(1) == y).mean())

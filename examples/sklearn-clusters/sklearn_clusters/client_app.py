"""A stock Flower ClientApp with scikit-learn (as in Flower's sklearn-logreg example): it
knows nothing of clusterfed and imports no torch. The model travels as NumPy arrays; the
clustered strategy sends each station its own cluster's model and gets the trained one back."""

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from sklearn_clusters.task import evaluate, load_data, train

app = ClientApp()


def _arrays(msg: Message) -> dict:
    return {name: array.numpy() for name, array in msg.content["arrays"].items()}


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    x_train, y_train, _, _ = load_data(context.node_config["partition-id"])
    config = msg.content["config"]  # local-epochs from the ServerApp (a clustering step may ask for more)
    trained, loss = train(_arrays(msg), x_train, y_train, epochs=int(config["local-epochs"]))
    arrays = ArrayRecord({name: Array(value) for name, value in trained.items()})
    metrics = MetricRecord({"train-loss": loss, "num-examples": len(y_train)})
    return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate_fn(msg: Message, context: Context) -> Message:
    _, _, x_test, y_test = load_data(context.node_config["partition-id"])
    loss, accuracy = evaluate(_arrays(msg), x_test, y_test)
    metrics = MetricRecord({"eval-loss": loss, "eval-acc": accuracy, "num-examples": len(y_test)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)

"""A stock Flower ClientApp (as in Flower's quickstart-pytorch): it knows nothing of clusterfed.
The clustered strategy sends each device its own cluster's model; the device trains it and
sends it back, as it would for FedAvg."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from sensor_clusters.task import Net, load_data, test, train

app = ClientApp()


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    partition_id = context.node_config["partition-id"]
    torch.manual_seed(partition_id)
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())  # the model of this device's cluster
    train_loader, _ = load_data(partition_id)
    config = msg.content["config"]  # lr and local-epochs from the ServerApp (a clustering step may ask for more epochs)
    loss = train(net, train_loader, epochs=int(config["local-epochs"]), lr=float(config["lr"]))
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(train_loader.dataset)})
    return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate_fn(msg: Message, context: Context) -> Message:
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    _, test_loader = load_data(context.node_config["partition-id"])
    loss, accuracy = test(net, test_loader)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": accuracy, "num-examples": len(test_loader.dataset)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)

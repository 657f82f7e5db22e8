"""A stock Flower ClientApp, written the way Flower's quickstart-pytorch writes one: it
knows nothing of clusterfed."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from userapp.task import Net, load_data, test, train

app = ClientApp()


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    torch.manual_seed(context.node_config["partition-id"])
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    train_loader, _ = load_data(context.node_config["partition-id"])
    loss = train(net, train_loader, epochs=int(msg.content["config"].get("local-epochs", 1)),
                 lr=float(msg.content["config"]["lr"]))
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

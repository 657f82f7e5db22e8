"""A stock Flower ClientApp in the shape of Flower's quickstart-pytorch ``client_app.py``:
``local-epochs`` and ``batch-size`` come from the run config (``context.run_config``), the
learning rate from the message; the message's ``local-epochs`` (a clustering step's
``cluster-epochs``) is ignored, as the quickstart ignores it."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from quickstartapp.task import Net, load_data, test, train

app = ClientApp()


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    partition_id = context.node_config["partition-id"]
    torch.manual_seed(partition_id)
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    trainloader, _ = load_data(partition_id, context.run_config["batch-size"])
    train_loss = train(model, trainloader, context.run_config["local-epochs"], msg.content["config"]["lr"])
    metrics = MetricRecord({"train_loss": train_loss, "num-examples": len(trainloader.dataset)})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate_fn(msg: Message, context: Context) -> Message:
    partition_id = context.node_config["partition-id"]
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    _, testloader = load_data(partition_id, context.run_config["batch-size"])
    loss, accuracy = test(model, testloader)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": accuracy, "num-examples": len(testloader.dataset)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)

"""A ClientApp that behaves as Flower's published quickstart-pytorch app (``flwr new`` with the
PyTorch template): the installed Flower (1.41) fetches its templates from the Flower Hub, so
no copy is available offline, and none is committed here. ``client_app`` follows the
quickstart's ClientApp step for step (a CIFAR-10 CNN, epochs from the run config's
``local-epochs``, the batch size from ``batch-size``, ``lr`` from the message, SGD with
momentum 0.9, ``train_loss`` / ``eval_loss`` / ``eval_acc`` / ``num-examples``); ``task``
holds its model and loops and, in place of Flower Datasets' CIFAR-10 partitions, generated
CIFAR-shaped group data (``load_data``; the shift is the environment's
``MODEL_MATRIX_SHIFT``, default ``concept``). The matrix runs it at lr 0.02
(``quickstart``) and at the example's own lr 0.1 (``quickstart-lr0.1``)."""

# the same client under two model names: at lr 0.02, and at the published example's lr 0.1
MODEL_NAMES = ("quickstart", "quickstart-lr0.1")

"""The model matrix: Flower user apps that are not clusterfed's (their own models, their own
stock quickstart-style ClientApp, their own ServerApp) run against clusterfed's strategies.

- ``models``: the users' models (an MLP, a BatchNorm ResNet-style CNN, a GRU, a Transformer
  encoder, a model with a 0-d buffer, a float16 MLP).
- ``data``: generated group-structured data shaped for each model (vectors, images, token
  sequences) with a concept shift (a label permutation per group) or a covariate shift (a
  per-group input transform).
- ``client_app``: a stock ClientApp (epochs from the run config, SGD with momentum, full
  state_dict replies); ``helper_app``: the same task through ``clusterfed.client``;
  ``quickstart``: a client behaving as Flower's quickstart-pytorch one, on CIFAR-shaped data.
- ``server_app``: the users' ServerApp (``strategy.start``); ``cells``: one matrix cell run
  in-process and scored against the true groups.
"""

"""What a run says about its decisions: functions that read a strategy's State and Params
(one module per family of strategies) and return the sentences the round lines and
clusters.json carry."""

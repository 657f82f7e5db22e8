"""sklearn-clusters: clustered FL with a stock scikit-learn ClientApp (no torch anywhere)."""

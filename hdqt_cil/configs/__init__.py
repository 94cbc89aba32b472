"""The configs Hydra composes a run from (config.yaml and its groups), shipped inside the package."""

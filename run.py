"""Entry point: `python run.py strategy=icarl quant=hdqt benchmark=hapt` (see README.md)."""
import warnings

import hydra
from hydra.core.hydra_config import HydraConfig

from hdqt_cil.config import register_resolvers

register_resolvers()
# avalanche imports an optional QP solver it never needs here and deprecates its own internals: not the user's concern.
warnings.filterwarnings("ignore", message="no QP solver found")
warnings.filterwarnings("ignore", message="No loggers specified")
warnings.filterwarnings("ignore", category=DeprecationWarning, module="avalanche")


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def main(cfg):
    from hdqt_cil.experiment import run, run_table

    hydra_cfg = HydraConfig.get()
    run_dir = hydra_cfg.runtime.output_dir
    summary = run(cfg, run_dir, job_num=hydra_cfg.job.get("num") or 0)
    print(run_table(run_dir))
    return summary["metrics"]["last_acc"]


if __name__ == "__main__":
    main()

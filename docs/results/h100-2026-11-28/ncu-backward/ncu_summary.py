"""ncu-summary.txt from this folder's Nsight Compute pages (ncu-raw.csv.gz: `ncu --import
rep.ncu-rep --page raw --csv`; ncu-source.csv.gz: `--page source --print-source sass --csv`),
with the tables of 2026-11-26's ncu_summary.py: per kernel, the pipes' use and the warps'
stall reasons; then where the stall samples fall in our gradient kernel and cuDNN's."""
import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "ncu_summary_2026_11_26", os.path.join(HERE, "..", "..", "h100-2026-11-26", "ncu",
                                           "ncu_summary.py"))
summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(summary)
summary.HERE = HERE
summary.SHORT = summary.SHORT + ("cudnn_generated",)

if __name__ == "__main__":
    summary.kernels_table()
    for kernel in ("dkdv_", "cudnn_generated"):
        summary.stall_locations(kernel, top=14)

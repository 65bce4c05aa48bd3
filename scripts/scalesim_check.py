"""Cross-checks `faultline scalesim --convention scalesim` against SCALE-Sim itself (PyPI).

Default (CI) mode: every shipped test topology on several arrays and all three dataflows;
SCALE-Sim's Total Cycles must equal Faultline's exactly, its utilisation columns to 1e-9
(relative), and its SRAM IFMAP reads, Filter reads and OFMAP writes exactly (tolerance 0).

--full: ResNet-18 and a BERT-base encoder layer on a 32x32 array, both tools timed side by side
(Faultline at cycle level); rows of dataflows not run keep their last values; writes reports/examples/scalesim/comparison.md (the guide's
commands/scalesim.md prints it). Slow (SCALE-Sim takes minutes per network).

Usage: scalesim_check.py --faultline BIN [--full [--dataflows ws,os,is]] [--root DIR]
"""

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time

CFG = """[general]
run_name = {name}

[architecture_presets]
ArrayHeight: {rows}
ArrayWidth: {cols}
IfmapSramSzkB: {ifmap_kb}
FilterSramSzkB: {filter_kb}
OfmapSramSzkB: {ofmap_kb}
IfmapOffset: 0
FilterOffset: 10000000
OfmapOffset: 20000000
Dataflow : {df}
Bandwidth : 10
ReadRequestBuffer: 32
WriteRequestBuffer: 32

[layout]
IfmapCustomLayout: False
IfmapSRAMBankBandwidth: 10
IfmapSRAMBankNum: 10
IfmapSRAMBankPort: 2
FilterCustomLayout: False
FilterSRAMBankBandwidth: 10
FilterSRAMBankNum: 10
FilterSRAMBankPort: 2

[sparsity]
SparsitySupport : false
SparseRep : ellpack_block
OptimizedMapping : false
BlockSize : 8
RandomNumberGeneratorSeed : 40

[run_presets]
InterfaceBandwidth: CALC
UseRamulatorTrace: False
"""

# SCALE-Sim reads a layout file even when custom layouts are off: one row per layer.
LAYOUT_HEADER = (
    "Layer name, IFMAP Height Intraline Factor, IFMAP Width Intraline Factor, Filter Height Intraline "
    "Factor, Filter Width Intraline Factor, Channel Intraline Factor, Num Filter Intraline Factor, IFMAP "
    "Height Intraline Order, IFMAP Width Intraline Order, Channel Intraline Order, IFMAP Height Interline "
    "Order, IFMAP Width Interline Order, Channel Interline Order, Filter Height Intraline Order, Filter "
    "Width Intraline Order, Channel Intraline Order, Num Filter Intraline Order, Filter Height Interline "
    "Order, Filter Width Interline Order, Channel Interline Order, Num Filter Interline Order,"
)
LAYOUT_ROW = ", 1, 1, 1, 1, 1, 1, 0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3,"

# (rows, cols, (ifmap, filter, ofmap) SRAM KiB): SCALE-Sim's default scratchpads, and 64 KiB on
# the 128x128 array (a machine whose banks Faultline derives from the array).
ARRAYS = [(8, 8, (256, 256, 128)), (16, 4, (256, 256, 128)), (32, 32, (256, 256, 128)), (64, 64, (256, 256, 128)),
          (128, 128, (64, 64, 64))]
DATAFLOWS = ["ws", "os", "is"]
TEST_TOPOLOGIES = ["topologies/test-gemms.csv", "topologies/test-convs.csv"]
FULL = [("ResNet-18", "topologies/resnet18.csv"), ("BERT-base encoder layer", "topologies/bert-base-encoder.csv")]


def read_report(path):
    """Rows of a SCALE-Sim style CSV as dicts (its `, ` separators and trailing comma)."""
    with open(path) as f:
        rows = list(csv.reader(f, skipinitialspace=True))
    head = [h.strip() for h in rows[0]]
    return [dict(zip(head, [c.strip() for c in r])) for r in rows[1:] if r]


def is_gemm(topology):
    with open(topology) as f:
        return len([c for c in f.readline().split(",") if c.strip()]) == 4


def layer_names(topology):
    with open(topology) as f:
        rows = [r for r in csv.reader(f) if r]
    names = []
    for r in rows[1:]:
        name = r[0].strip()
        # Depth-wise rows are one layer per channel in SCALE-Sim, and need one layout row each.
        if "DP" in name and not is_gemm(topology):
            names += [name] * int(r[5])
        else:
            names.append(name)
    return names


def run_scalesim(work, rows, cols, df, topology, kb=(256, 256, 128)):
    """Runs SCALE-Sim in this process; returns (its report dir, wall seconds)."""
    from scalesim.scale_sim import scalesim

    name = f"ss_{rows}x{cols}_{df}_{os.path.splitext(os.path.basename(topology))[0]}"
    cfg = os.path.join(work, name + ".cfg")
    with open(cfg, "w") as f:
        f.write(CFG.format(name=name, rows=rows, cols=cols, df=df, ifmap_kb=kb[0], filter_kb=kb[1], ofmap_kb=kb[2]))
    layout = os.path.join(work, name + "_layout.csv")
    with open(layout, "w") as f:
        f.write(LAYOUT_HEADER + "\n" + "".join(n + LAYOUT_ROW + "\n" for n in layer_names(topology)))
    start = time.perf_counter()
    s = scalesim(save_disk_space=True, verbose=False, config=cfg, topology=topology, layout=layout,
                 input_type_gemm=is_gemm(topology))
    s.run_scale(top_path=work)
    return os.path.join(work, name), time.perf_counter() - start, cfg


def run_faultline(faultline, cfg, topology, out, mode="functional"):
    start = time.perf_counter()
    p = subprocess.run([faultline, "scalesim", "--config", cfg, "--topology", topology, "--out", out,
                        "--convention", "scalesim", "--mode", mode], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if p.returncode != 0:
        sys.exit(f"faultline scalesim failed on {cfg} {topology}: {p.stderr.strip()}")
    return out, wall, p.stdout


def close(a, b):
    a, b = float(a), float(b)
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def check(faultline, root):
    compared, failures = 0, []
    with tempfile.TemporaryDirectory() as work:
        for topo in TEST_TOPOLOGIES:
            topology = os.path.join(root, topo)
            for rows, cols, kb in ARRAYS:
                for df in DATAFLOWS:
                    ss_dir, _, cfg = run_scalesim(work, rows, cols, df, topology, kb)
                    fl_dir, _, _ = run_faultline(faultline, cfg, topology, os.path.join(work, f"fl_{rows}x{cols}_{df}"))
                    pairs = [("COMPUTE_REPORT.csv", ["Total Cycles"], ["Overall Util %", "Mapping Efficiency %", "Compute Util %"]),
                             ("DETAILED_ACCESS_REPORT.csv", ["SRAM IFMAP Reads", "SRAM Filter Reads", "SRAM OFMAP Writes"], [])]
                    for report, exact, approx in pairs:
                        theirs = read_report(os.path.join(ss_dir, report))
                        ours = read_report(os.path.join(fl_dir, report))
                        if len(theirs) != len(ours):
                            failures.append(f"{topo} {rows}x{cols} {df}: {len(theirs)} layers in SCALE-Sim, {len(ours)} here")
                            continue
                        for t, o in zip(theirs, ours):
                            where = f"{topo} {rows}x{cols} {df} layer {o['LayerID']} ({o['Layer']})"
                            for col in exact:
                                compared += 1
                                if int(float(t[col])) != int(float(o[col])):
                                    failures.append(f"{where}: {col} SCALE-Sim {t[col]}, Faultline {o[col]}")
                            for col in approx:
                                compared += 1
                                if not close(t[col], o[col]):
                                    failures.append(f"{where}: {col} SCALE-Sim {t[col]}, Faultline {o[col]}")
    runs = len(TEST_TOPOLOGIES) * len(ARRAYS) * len(DATAFLOWS)
    if failures:
        print("\n".join(failures[:40]))
        sys.exit(f"scalesim-check: {len(failures)} of {compared} values differ from SCALE-Sim's")
    print(f"scalesim-check: {runs} SCALE-Sim runs ({', '.join(TEST_TOPOLOGIES)} on "
          f"{', '.join(f'{r}x{c}' for r, c, _ in ARRAYS)}, ws/os/is): all {compared} compared values equal "
          f"(total cycles and SRAM counts exactly, utilisation to 1e-9)")


def full(faultline, root, dataflows):
    lines = ["| network | dataflow | layers | SCALE-Sim total cycles | Faultline array cycles | vs SCALE-Sim "
             "| Faultline with DMA | SCALE-Sim wall | Faultline wall (cycle level) | speed-up |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as work:
        for label, topo in FULL:
            topology = os.path.join(root, topo)
            for df in dataflows:
                # SRAMs large enough that SCALE-Sim never stalls on them either (CALC mode).
                ss_dir, ss_wall, cfg = run_scalesim(work, 32, 32, df, topology, kb=(8192, 8192, 8192))
                fl_dir, fl_wall, _ = run_faultline(faultline, cfg, topology, os.path.join(work, f"fl_{df}_{len(lines)}"),
                                                   mode="cycle")
                theirs = read_report(os.path.join(ss_dir, "COMPUTE_REPORT.csv"))
                ours = read_report(os.path.join(fl_dir, "COMPUTE_REPORT.csv"))
                for t, o in zip(theirs, ours):
                    if int(float(t["Total Cycles"])) != int(float(o["Total Cycles"])):
                        sys.exit(f"{label} {df} layer {o['Layer']}: SCALE-Sim {t['Total Cycles']}, Faultline {o['Total Cycles']}")
                # SCALE-Sim's Total Cycles is an index: a count is one more.
                ss = sum(int(float(t["Total Cycles"])) + 1 for t in theirs)
                arr = sum(int(o["Faultline Array Cycles"]) for o in ours)
                dma = sum(int(o["Faultline Cycles (with DMA)"]) for o in ours)
                lines.append(f"| {label} | {df} | {len(ours)} | {ss:,} | {arr:,} | {100.0 * (arr / ss - 1):+.1f}% "
                             f"| {dma:,} | {ss_wall:.1f} s | {fl_wall:.1f} s | {ss_wall / fl_wall:.0f}x |")
                print(lines[-1], flush=True)
    out = os.path.join(root, "reports", "examples", "scalesim")
    os.makedirs(out, exist_ok=True)
    # Rows of dataflows not run this time are kept from the last table, in a fixed order.
    key = lambda row: tuple(c.strip() for c in row.split("|")[1:3])
    rows = {key(r): r for r in lines[2:]}
    old = os.path.join(out, "comparison.md")
    if os.path.exists(old):
        with open(old) as f:
            for r in f.read().splitlines()[2:]:
                rows.setdefault(key(r), r)
    order = [(label, df) for label, _ in FULL for df in DATAFLOWS]
    table = "\n".join(lines[:2] + [rows[k] for k in order if k in rows]) + "\n"
    with open(os.path.join(out, "comparison.md"), "w") as f:
        f.write(table)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--faultline", required=True)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--dataflows", default="ws,os,is", help="--full: the dataflows to run, comma-separated")
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    os.chdir(root)
    if a.full:
        full(a.faultline, root, [d.strip() for d in a.dataflows.split(",")])
    else:
        check(a.faultline, root)


if __name__ == "__main__":
    main()

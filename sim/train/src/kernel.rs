//! One op on the machine, run as a training step runs it: `faultline op`.
//!
//! The op's graph ([`KernelGraph`]) is lowered, placed and scheduled like a step, and run by the
//! step's interpreter with the step's fault path: a fault is a [`StepFault`] on the op's own
//! clock, resolved by [`crate::inject::resolve_upset`] and run as in training, so a site, a cycle
//! and an effect mean the same thing here as in `train --inject` and in a campaign.

use crate::error::{Result, TrainError};
use crate::exec::{graph_host_bytes, run_bound, DirectRun, MxuFormat, Placed, StepOutput};
use crate::inject::{self, InjectionReport, StepFault};
use faultline_graph::kernel::KernelGraph;
use faultline_graph::{OpGraph, Program, StepSchedule};
use faultline_hw::kernel::KernelSpec;
use faultline_hw::{ExecMode, HwConfig};

/// One op lowered and placed on a machine, ready to run in one mode.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// The op.
    pub spec: KernelSpec,
    /// The machine, with the MXU set to the chosen input format and fp32 accumulation
    /// ([`crate::Executor::machine`]).
    pub hw: HwConfig,
    /// Functional or cycle-level execution (bit-identical results).
    pub mode: ExecMode,
    /// The op's graph.
    pub graph: KernelGraph,
    /// The placed program.
    program: Program,
    /// Its direct form: what a fault-free run interprets.
    direct: DirectRun,
    /// Its schedule on `hw`, computed once.
    schedule: StepSchedule,
}

/// What one run of a [`Kernel`] gives.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelRun {
    /// Each output's fp32 bits, in [`KernelSpec::output_lens`] order.
    pub outputs: Vec<Vec<u32>>,
    /// The cycles the run issued (the schedule's total).
    pub cycles: u64,
    /// With a fault: where it landed and what it did to the instruction it hit.
    pub injection: Option<InjectionReport>,
}

impl Placed for Kernel {
    fn hw(&self) -> &HwConfig {
        &self.hw
    }
    fn program(&self) -> &Program {
        &self.program
    }
    fn graph(&self) -> &OpGraph {
        &self.graph.graph
    }
}

impl Kernel {
    /// `spec` lowered and placed on `hw` with `format` MXU inputs; an error names the op when
    /// its shape is refused or it does not fit the machine's memories.
    pub fn new(spec: &KernelSpec, hw: &HwConfig, mode: ExecMode, format: MxuFormat) -> Result<Kernel> {
        let hw = crate::Executor::machine(hw, format);
        let graph = KernelGraph::of(spec).map_err(|e| graph_error(spec, e))?;
        let program = graph.program().and_then(|p| p.place(&hw)).map_err(|e| graph_error(spec, e))?;
        let direct = DirectRun::new(program.direct());
        let schedule = program.schedule(&graph.graph, &hw);
        Ok(Kernel { spec: *spec, hw, mode, graph, program, direct, schedule })
    }

    /// Host bytes one run of `spec` on `hw` needs, from the op's shapes alone (`None` beyond
    /// 2^64), after checking that its shape is valid and its data fits the DRAM: an op that
    /// cannot run is refused for that reason before anything proportional to it exists.
    pub fn host_bytes(spec: &KernelSpec, hw: &HwConfig) -> Result<Option<u64>> {
        spec.check_on(hw)?;
        Ok(graph_host_bytes(&KernelGraph::of(spec).map_err(|e| graph_error(spec, e))?.graph))
    }

    /// The placed program: what [`Kernel::run`] interprets.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The program's schedule on this machine: the cycles a run issues, instruction by
    /// instruction.
    pub fn schedule(&self) -> &StepSchedule {
        &self.schedule
    }

    /// Runs the op on `inputs` (fp32 bits, [`KernelSpec::input_lens`] long each) with the bits of
    /// `upset` struck (none: fault-free; their `step` is ignored, the op is one step). Errors
    /// name the input of the wrong length, or the fault that cannot strike this op.
    pub fn run(&self, inputs: &[Vec<u32>], upset: &[StepFault]) -> Result<KernelRun> {
        if inputs.len() != self.graph.inputs.len() {
            return Err(TrainError::Config(format!(
                "op {} takes {} inputs, got {}",
                self.spec.describe(),
                self.graph.inputs.len(),
                inputs.len()
            )));
        }
        let p = &self.program;
        let bind = || {
            let mut bufs = vec![Vec::new(); p.buffers.len()];
            for (&node, x) in self.graph.inputs.iter().zip(inputs) {
                let b = p.buffer_of(node).expect("an op's inputs have buffers");
                if x.len() != p.buffers[b.index()].len {
                    let name = &self.graph.graph.node(node).name;
                    let want = p.buffers[b.index()].len;
                    return Err(TrainError::Config(format!("op input `{name}` has {} values, not {want}", x.len())));
                }
                bufs[b.index()] = x.clone();
            }
            if let Some((node, t)) = self.graph.step {
                let b = p.buffer_of(node).expect("the step has a buffer");
                bufs[b.index()] = vec![(t as f32).to_bits()];
            }
            Ok(bufs)
        };
        let sched = &self.schedule;
        if let Some(f) = upset.iter().find(|f| f.cycle >= sched.total_cycles) {
            return Err(TrainError::Config(format!(
                "fault at `{}`: cycle {} is after the op {} ends at cycle {}",
                f.site,
                f.cycle,
                self.spec.describe(),
                sched.total_cycles
            )));
        }
        let mut bufs = Vec::new();
        let (out, injection) = inject::run_upset(self, sched, upset, |inj| {
            let (out, b): (StepOutput, _) = run_bound(
                &self.hw,
                self.mode,
                &self.graph.graph,
                p,
                (&self.direct, crate::exec::POOLED_WORDS),
                &bind,
                inj,
                None,
            )?;
            bufs = b;
            Ok(out)
        })?;
        let outputs = self.graph.outputs.iter().map(|&o| {
            let b = p.buffer_of(o).expect("an op's outputs have buffers");
            std::mem::take(&mut bufs[b.index()])
        });
        Ok(KernelRun { outputs: outputs.collect(), cycles: out.cycles, injection })
    }
}

/// A graph error lowering or placing `spec`, naming the op.
fn graph_error(spec: &KernelSpec, e: faultline_graph::GraphError) -> TrainError {
    TrainError::Config(format!("op {}: {e}", spec.describe()))
}

//! Checks: protection a step computes beside training. ABFT checksums of a GEMM, a range check
//! of a tensor, a duplicated op: each adds nodes after the node it guards, the last of which is
//! a one-word *residual* (`max |difference|` or `max |value|`). The step program keeps it, and
//! after the step the host compares it with the check's threshold, as it reads the loss. The
//! checks' nodes are lowered like any other (GEMMs on the MXU, the rest on the VPU), so they
//! cost cycles in the step's one schedule and their registers are fault sites. No check feeds
//! training: a protected step trains to the same bits as an unprotected one.
//!
//! ABFT (Huang & Abraham) for `C = op(A) op(B)` (`[M, K] x [K, N]`) checks one side:
//! * [`Side::Rows`]: the row sums of `op(B)` over each tile of `T` columns (`Bs`, `[K, N / T]`,
//!   a VPU reduction) multiply `op(A)` on the MXU (`A Bs`, `[M, N / T]`); each equals the row
//!   sums of `C` over the same tile (`Cs`) up to round-off.
//! * [`Side::Cols`]: the column sums of `op(A)` over each tile of `T` rows (`As`, `[M / T, K]`)
//!   multiply `op(B)` (`As B`, `[M / T, N]`) and are compared with the column sums of `C` over
//!   the same rows.
//!
//! *Global* ABFT takes one tile (`T = N`, or `T = M`): one checksum per GEMM; *per-tile* ABFT
//! takes `T` = the array's width (`Rows`) or height (`Cols`). Which side is cheaper depends on
//! the GEMM's shape: the reductions run fastest along long rows of lanes, and the checksum GEMM
//! costs a weight load per fold (`Cols`) or a stream of `M` rows (`Rows`).
//!
//! A *clamp* ([`TrainGraph::add_clamp`], Ranger's range restriction) is the one protection that
//! does feed training: an [`Op::Clamp`] node after the node it restricts, which every consumer
//! of that node (forward and backward, and the checks of other nodes) reads instead, so the rest
//! of the step sees the restricted value; the guarded node's own checks still read it raw. It
//! detects nothing and has no gradient node: gradients pass it straight through. A clamp is
//! added after the graph is built, so it is the one node whose index is above some of its
//! readers': [`TrainGraph::execution_order`] runs it right after the node it restricts.

use crate::error::GraphError;
use crate::op::Op;
use crate::train_graph::TrainGraph;
use crate::NodeIndex;
use serde::Serialize;

/// Which side of a GEMM ABFT checksums.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub enum Side {
    /// Row sums of `op(B)` per tile of output columns; checked against `C`'s row sums.
    Rows,
    /// Column sums of `op(A)` per tile of output rows; checked against `C`'s column sums.
    Cols,
}

/// What a check computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum CheckKind {
    /// ABFT checksums of a GEMM, one per `tile` output columns (`Rows`) or rows (`Cols`).
    Abft {
        /// The checksummed side.
        side: Side,
        /// Output columns (`Rows`) or rows (`Cols`) per checksum (all of them for global ABFT).
        tile: usize,
    },
    /// `max |x|` of the guarded tensor.
    Range,
    /// The guarded op computed twice; `max |difference|`.
    Duplicate,
    /// The squared global gradient norm `sum g^2` over every parameter (before clipping).
    GradNorm,
    /// The squared norm of the step's update `sum (w' - w)^2` over every parameter.
    UpdateNorm,
}

/// One clamp added to a step graph (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Clamp {
    /// Name: the restricted node's, with `.clamp` (`relu1.clamp`).
    pub name: String,
    /// The node it restricts.
    #[serde(skip)]
    pub guarded: NodeIndex,
    /// The `Op::Clamp` node.
    #[serde(skip)]
    pub node: NodeIndex,
}

/// One check added to a step graph.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    /// Name: the guarded node's, with the kind (`fc1.matmul.abft`).
    pub name: String,
    /// What it computes.
    pub kind: CheckKind,
    /// The node it guards.
    #[serde(skip)]
    pub guarded: NodeIndex,
    /// Its one-word residual.
    #[serde(skip)]
    pub residual: NodeIndex,
    /// Every node it added, in order (the residual last).
    #[serde(skip)]
    pub nodes: Vec<NodeIndex>,
}

impl TrainGraph {
    /// Adds global (`tile` `None`) or per-tile ABFT on `side` to the rank-2 `MatMul` node `c`;
    /// returns the check's index in [`TrainGraph::checks`]. Errors for another op, a rank-3
    /// product, or a tile that does not divide the checksummed dimension.
    pub fn add_abft(&mut self, c: NodeIndex, side: Side, tile: Option<usize>) -> Result<usize, GraphError> {
        let node = self.graph.node(c).clone();
        let Op::MatMul { trans_a, trans_b } = node.op else {
            return Err(self.not_checkable(c, "ABFT guards MatMul nodes"));
        };
        if node.shape.len() != 2 {
            return Err(self.not_checkable(c, "ABFT guards rank-2 products (a rank-3 one is several GEMMs)"));
        }
        let (m, n) = (node.shape[0], node.shape[1]);
        let dim = if side == Side::Rows { n } else { m };
        let t = tile.unwrap_or(dim).min(dim);
        if t == 0 || dim % t != 0 {
            return Err(self.not_checkable(c, &format!("a checksum tile of {t} does not divide {dim}")));
        }
        let (a, b) = (node.inputs[0], node.inputs[1]);
        // Global and per-tile ABFT of one GEMM may both be added: the tile tells them apart.
        let name = if t == dim { format!("{}.abft", node.name) } else { format!("{}.abft{t}", node.name) };
        let mut nodes = Vec::new();
        let mut add = |g: &mut TrainGraph, op: Op, suffix: &str, ins: &[NodeIndex]| {
            let i = g.graph.add(op, &format!("{name}.{suffix}"), &node.layer, node.phase, ins)?;
            nodes.push(i);
            Ok::<_, GraphError>(i)
        };
        let (check, cs) = match side {
            Side::Rows => {
                // op(B)'s row sums per tile: B stored [K, N] sums runs of columns, [N, K] of rows.
                let bs = add(self, Op::TileSum { tile: t, rows: trans_b }, "bsum", &[b])?;
                let check = add(self, Op::MatMul { trans_a, trans_b }, "check", &[a, bs])?;
                (check, add(self, Op::TileSum { tile: t, rows: false }, "csum", &[c])?)
            }
            Side::Cols => {
                // op(A)'s column sums per tile: A stored [M, K] sums runs of rows, [K, M] of columns.
                let asum = add(self, Op::TileSum { tile: t, rows: !trans_a }, "asum", &[a])?;
                let check = add(self, Op::MatMul { trans_a, trans_b }, "check", &[asum, b])?;
                (check, add(self, Op::TileSum { tile: t, rows: true }, "csum", &[c])?)
            }
        };
        let residual = add(self, Op::MaxAbsDiff, "residual", &[check, cs])?;
        Ok(self.push_check(Check { name, kind: CheckKind::Abft { side, tile: t }, guarded: c, residual, nodes }))
    }

    /// Adds a range check (`max |x|`) of node `x`; returns its index.
    pub fn add_range_check(&mut self, x: NodeIndex) -> Result<usize, GraphError> {
        let node = self.graph.node(x).clone();
        let name = format!("{}.range", node.name);
        let residual = self.graph.add(Op::MaxAbs, &name, &node.layer, node.phase, &[x])?;
        Ok(self.push_check(Check { name, kind: CheckKind::Range, guarded: x, residual, nodes: vec![residual] }))
    }

    /// Duplicates the op of node `x` (same inputs, run again) and compares the two; returns
    /// the check's index. Errors for a placeholder.
    pub fn add_duplicate(&mut self, x: NodeIndex) -> Result<usize, GraphError> {
        let node = self.graph.node(x).clone();
        if node.op.is_placeholder() || matches!(node.op, Op::Reshape { .. }) {
            return Err(self.not_checkable(x, "a placeholder or reshape computes nothing to duplicate"));
        }
        let name = format!("{}.dup", node.name);
        let twin = self.graph.add(node.op.clone(), &format!("{name}.twin"), &node.layer, node.phase, &node.inputs)?;
        let residual =
            self.graph.add(Op::MaxAbsDiff, &format!("{name}.residual"), &node.layer, node.phase, &[x, twin])?;
        Ok(self.push_check(Check {
            name,
            kind: CheckKind::Duplicate,
            guarded: x,
            residual,
            nodes: vec![twin, residual],
        }))
    }

    /// Adds a check whose residual is the squared global gradient norm (every parameter's
    /// gradient, before clipping): the clipping's own sum when the step clips (the check adds
    /// no instruction; its value is stored for the host), else a `SumSquares` per gradient
    /// added up in parameter order on the VPU. Returns its index.
    pub fn add_grad_norm_check(&mut self) -> Result<usize, GraphError> {
        let last = (self.params.iter().map(|p| p.grad).max())
            .ok_or_else(|| self.not_checkable(self.loss, "the model has no parameters"))?;
        let (residual, nodes) = match self.grad_sumsq {
            Some(s) => (s, Vec::new()),
            None => {
                let terms = |g: &mut TrainGraph, p: usize| -> Result<(Op, Vec<NodeIndex>), GraphError> {
                    Ok((Op::SumSquares, vec![g.params[p].grad]))
                };
                self.sum_over_params("grad_norm", terms)?
            }
        };
        let guarded = if nodes.is_empty() { residual } else { last };
        let c = Check { name: "grad_norm".into(), kind: CheckKind::GradNorm, guarded, residual, nodes };
        Ok(self.push_check(c))
    }

    /// Adds a check whose residual is the squared norm of the step's update, `sum (w' - w)^2`
    /// over every parameter (a `SumSquaredDiff` per parameter, added up in parameter order on
    /// the VPU). Returns its index.
    pub fn add_update_norm_check(&mut self) -> Result<usize, GraphError> {
        let last = (self.params.iter().map(|p| p.next).max())
            .ok_or_else(|| self.not_checkable(self.loss, "the model has no parameters"))?;
        let terms = |g: &mut TrainGraph, p: usize| -> Result<(Op, Vec<NodeIndex>), GraphError> {
            Ok((Op::SumSquaredDiff, vec![g.params[p].next, g.params[p].node]))
        };
        let (residual, nodes) = self.sum_over_params("update_norm", terms)?;
        let c = Check { name: "update_norm".into(), kind: CheckKind::UpdateNorm, guarded: last, residual, nodes };
        Ok(self.push_check(c))
    }

    /// One `[1]` term per parameter (`term` gives its op and inputs) added up in parameter
    /// order, as nodes named `<name>.<param>` in the update phase: the last node and all.
    fn sum_over_params(
        &mut self,
        name: &str,
        term: impl Fn(&mut TrainGraph, usize) -> Result<(Op, Vec<NodeIndex>), GraphError>,
    ) -> Result<(NodeIndex, Vec<NodeIndex>), GraphError> {
        if self.checks.iter().any(|c| c.name == name) {
            return Err(self.not_checkable(self.loss, &format!("the step has a `{name}` check already")));
        }
        let mut nodes = Vec::new();
        let mut total = None;
        for p in 0..self.params.len() {
            let (op, ins) = term(self, p)?;
            let (pname, layer) = (self.params[p].name.clone(), self.params[p].layer.clone());
            let t = self.graph.add(op, &format!("{name}.{pname}"), &layer, crate::op::Phase::Update, &ins)?;
            nodes.push(t);
            if let Some(sum) = total {
                let s = self.graph.add(
                    Op::Add,
                    &format!("{name}.sum.{pname}"),
                    "check",
                    crate::op::Phase::Update,
                    &[sum, t],
                )?;
                nodes.push(s);
                total = Some(s);
            } else {
                total = Some(t);
            }
        }
        Ok((total.expect("at least one parameter"), nodes))
    }

    /// Restricts node `x` to `[-bound, bound]`: adds `<name>.clamp` (an [`Op::Clamp`] in `x`'s
    /// phase and layer) and makes every node that read `x` (except the nodes of `x`'s own
    /// checks) read the clamp instead, as do the step's named values (`output`, `loss`, each
    /// parameter's `grad` and `next`, each optimizer state's `next`); returns the clamp node. Errors for a placeholder, a
    /// check's node, a clamp, a node already clamped, or a bound that is negative or NaN.
    pub fn add_clamp(&mut self, x: NodeIndex, bound: f32) -> Result<NodeIndex, GraphError> {
        let node = self.graph.node(x).clone();
        if node.op.is_placeholder() || matches!(node.op, Op::Clamp { .. }) {
            return Err(self.not_checkable(x, "a placeholder or clamp is not restricted"));
        }
        if self.checks.iter().any(|c| c.nodes.contains(&x)) {
            return Err(self.not_checkable(x, "a check's node feeds no training"));
        }
        if self.clamps.iter().any(|c| c.guarded == x) {
            return Err(self.not_checkable(x, "it is clamped already"));
        }
        Self::check_bound(&self.graph.file, &node.name, bound)?;
        let own: Vec<NodeIndex> =
            self.checks.iter().filter(|c| c.guarded == x).flat_map(|c| c.nodes.iter().copied()).collect();
        let readers: Vec<NodeIndex> = self.graph.readers(x).into_iter().filter(|r| !own.contains(r)).collect();
        let name = format!("{}.clamp", node.name);
        let clamp = self.graph.add(Op::Clamp { bound }, &name, &node.layer, node.phase, &[x])?;
        for r in readers {
            self.graph.redirect(r, x, clamp);
        }
        // The values the host reads after a step are the restricted ones too.
        let named = [&mut self.output, &mut self.loss]
            .into_iter()
            .chain(self.params.iter_mut().flat_map(|p| [&mut p.grad, &mut p.next]))
            .chain(self.opt_state.iter_mut().map(|s| &mut s.next));
        for n in named.filter(|n| **n == x) {
            *n = clamp;
        }
        self.clamps.push(Clamp { name, guarded: x, node: clamp });
        Ok(clamp)
    }

    /// Sets the bound of clamp node `c` (learned after the graph is built). Errors for a node
    /// that is not a clamp, or a bound that is negative or NaN.
    pub fn set_clamp_bound(&mut self, c: NodeIndex, bound: f32) -> Result<(), GraphError> {
        let name = self.graph.node(c).name.clone();
        Self::check_bound(&self.graph.file, &name, bound)?;
        match &mut self.graph.graph[c].op {
            Op::Clamp { bound: b } => {
                *b = bound;
                Ok(())
            }
            _ => Err(self.not_checkable(c, "only a clamp node has a bound")),
        }
    }

    fn check_bound(file: &std::path::Path, node: &str, bound: f32) -> Result<(), GraphError> {
        if bound >= 0.0 {
            return Ok(());
        }
        Err(GraphError::Invalid {
            file: file.into(),
            node: node.into(),
            message: format!("a clamp bound must be >= 0, not {bound}"),
        })
    }

    /// The checks added so far, in order.
    pub fn checks(&self) -> &[Check] {
        &self.checks
    }

    /// The clamps added so far, in order.
    pub fn clamps(&self) -> &[Clamp] {
        &self.clamps
    }

    /// Every node in the order a step runs them: the graph's own order, each clamp and then
    /// each check's nodes right after the node they guard (their inputs all come before it),
    /// so that the clamp's readers come after it and a check reads its operands while they are
    /// still live.
    pub fn execution_order(&self) -> Vec<NodeIndex> {
        let mut moved: Vec<bool> = vec![false; self.graph.len()];
        let mut after: Vec<Vec<NodeIndex>> = vec![Vec::new(); self.graph.len()];
        for c in &self.clamps {
            after[c.guarded.index()].push(c.node);
            moved[c.node.index()] = true;
        }
        for c in &self.checks {
            after[c.guarded.index()].extend(&c.nodes);
            for n in &c.nodes {
                moved[n.index()] = true;
            }
        }
        let mut order = Vec::with_capacity(self.graph.len());
        for i in self.graph.indices().filter(|i| !moved[i.index()]) {
            order.push(i);
            order.extend(&after[i.index()]);
        }
        order
    }

    fn push_check(&mut self, c: Check) -> usize {
        self.checks.push(c);
        self.checks.len() - 1
    }

    fn not_checkable(&self, i: NodeIndex, why: &str) -> GraphError {
        let node = self.graph.node(i);
        GraphError::Invalid {
            file: self.graph.file.clone(),
            node: node.name.clone(),
            message: format!("cannot check `{}` ({}): {why}", node.name, node.op.name()),
        }
    }
}

/// The unit round-off of fp32 accumulation, `2^-24`.
pub const FP32_UNIT: f64 = 1.0 / 16_777_216.0;

/// The unit round-off of bf16 MXU inputs, `2^-8`.
pub const BF16_UNIT: f64 = 1.0 / 256.0;

/// `gamma_n = n u / (1 - n u)`: the relative error bound of an `n`-term fp32 sum (Higham).
pub fn gamma(n: usize) -> f64 {
    let nu = n as f64 * FP32_UNIT;
    nu / (1.0 - nu)
}

/// The largest fault-free ABFT residual of `C = op(A) op(B)` checked on `side` with tiles of
/// `tile`, from the accumulation bound: `a` and `b` are the stored operands (`a` is `[M, K]`,
/// or `[K, M]` with `ta`; `b` is `[K, N]`, or `[N, K]` with `tb`), `input_unit` the unit
/// round-off of the MXU's input format ([`BF16_UNIT`] or [`FP32_UNIT`]).
///
/// Derivation for `Rows` (each sum in fp32, any order; `Cols` is the transpose): the GEMM
/// rounds each `c_in` within `gamma_K sum_k |a_ik||b_kn|` of the exact product of the rounded
/// inputs; the output checksum `Cs_ij` adds `gamma_T sum_n |c_in|`; the operand checksum
/// `Bs_kj` is summed in fp32 from the unrounded `B` (`gamma_T`), differs from the sum of the
/// rounded `B` by `u_in`, and is itself rounded to the input format when fed (`u_in`); the
/// checksum GEMM adds `gamma_K`. So `|check_ij - Cs_ij| <= (2 u_in + 2 gamma_(K+T+2)) S_ij` up
/// to second-order terms, with `S_ij = sum_k |a_ik| sum_(n in tile j) |b_kn|` (inputs rounded
/// up by `(1 + u_in)^2`); the bound returned is `1.01` times that at the largest `S_ij`, plus
/// `K T 2^-149` for subnormal underflow.
#[allow(clippy::too_many_arguments)]
pub fn abft_bound(
    a: &[f32],
    b: &[f32],
    ta: bool,
    tb: bool,
    [m, k, n]: [usize; 3],
    side: Side,
    tile: usize,
    input_unit: f64,
) -> f64 {
    let av = |i: usize, kk: usize| (if ta { a[kk * m + i] } else { a[i * k + kk] } as f64).abs();
    let bv = |kk: usize, j: usize| (if tb { b[j * k + kk] } else { b[kk * n + j] } as f64).abs();
    let dim = if side == Side::Rows { n } else { m };
    let t = tile.clamp(1, dim.max(1));
    let tiles = dim.div_ceil(t);
    let mut worst = 0f64;
    match side {
        Side::Rows => {
            // |B| summed over each tile of columns: bs[k][j]; then S = |A| bs.
            let mut bs = vec![0f64; k * tiles];
            for kk in 0..k {
                for j in 0..n {
                    bs[kk * tiles + j / t] += bv(kk, j);
                }
            }
            let mut row = vec![0f64; tiles];
            for i in 0..m {
                row.iter_mut().for_each(|r| *r = 0.0);
                for kk in 0..k {
                    let v = av(i, kk);
                    if v != 0.0 {
                        for (r, s) in row.iter_mut().zip(&bs[kk * tiles..(kk + 1) * tiles]) {
                            *r += v * s;
                        }
                    }
                }
                worst = row.iter().fold(worst, |w, &r| w.max(r));
            }
        }
        Side::Cols => {
            // |A| summed over each tile of rows: as[i][k]; then S = as |B|.
            let mut asum = vec![0f64; tiles * k];
            for i in 0..m {
                for kk in 0..k {
                    asum[(i / t) * k + kk] += av(i, kk);
                }
            }
            let mut row = vec![0f64; n];
            for ti in 0..tiles {
                row.iter_mut().for_each(|r| *r = 0.0);
                for kk in 0..k {
                    let v = asum[ti * k + kk];
                    if v != 0.0 {
                        for (j, r) in row.iter_mut().enumerate() {
                            *r += v * bv(kk, j);
                        }
                    }
                }
                worst = row.iter().fold(worst, |w, &r| w.max(r));
            }
        }
    }
    let f = 2.0 * input_unit + 2.0 * gamma(k + t + 2);
    1.01 * f * worst * (1.0 + input_unit).powi(2) + (k * t) as f64 * f64::from(f32::from_bits(1))
}

//! The op graph: nodes tagged with phase and layer on a petgraph DAG, with shape checking.

use crate::error::GraphError;
use crate::op::{Op, Phase};
use petgraph::graph::{DiGraph, NodeIndex};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Largest tensor a node may have (2^28 elements: far beyond any model this simulator runs,
/// small enough that element counts never overflow).
pub const MAX_ELEMENTS: usize = 1 << 28;

/// One node: an op applied to earlier nodes, producing one tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// What the node computes.
    pub op: Op,
    /// Unique name, e.g. `fc1.matmul`, `fc1.weight`, `grad/fc1.weight`, `fc1.weight.next`.
    pub name: String,
    /// Layer of the model the node belongs to (`loss` for the loss, `input` for placeholders of
    /// the data); backward and update nodes carry the layer whose forward node they serve.
    pub layer: String,
    /// Forward, backward or update.
    pub phase: Phase,
    /// Output shape.
    pub shape: Vec<usize>,
    /// Input nodes in op order (also present as edges `input -> self` weighted by position).
    pub inputs: Vec<NodeIndex>,
}

/// A DAG of [`Node`]s. Edges run from producer to consumer, weighted by the input position.
#[derive(Debug, Clone, Default)]
pub struct OpGraph {
    /// The petgraph DAG (nodes are never removed, so indices are stable and dense).
    pub graph: DiGraph<Node, usize>,
    by_name: BTreeMap<String, NodeIndex>,
    /// File named in errors (`<inline>` if the graph was not built from a file).
    pub file: PathBuf,
}

impl OpGraph {
    /// An empty graph whose errors name `file`.
    pub fn new(file: impl Into<PathBuf>) -> OpGraph {
        OpGraph { graph: DiGraph::new(), by_name: BTreeMap::new(), file: file.into() }
    }

    /// The node at `i`.
    pub fn node(&self, i: NodeIndex) -> &Node {
        &self.graph[i]
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.graph.node_count()
    }

    /// Whether the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.graph.node_count() == 0
    }

    /// Looks a node up by name.
    pub fn find(&self, name: &str) -> Option<NodeIndex> {
        self.by_name.get(name).copied()
    }

    /// All node indices in insertion order. Insertion order is already topological (a node can
    /// only use earlier nodes), so this is also an execution order.
    pub fn indices(&self) -> impl Iterator<Item = NodeIndex> + '_ {
        self.graph.node_indices()
    }

    /// A topological order computed by petgraph (errors only for hand-made cycles).
    pub fn topo_order(&self) -> Result<Vec<NodeIndex>, GraphError> {
        petgraph::algo::toposort(&self.graph, None)
            .map_err(|c| GraphError::Cycle { node: self.graph[c.node_id()].name.clone() })
    }

    /// Adds a placeholder (input, label, step, parameter or optimizer state) of a given shape.
    pub fn placeholder(
        &mut self,
        op: Op,
        name: &str,
        layer: &str,
        phase: Phase,
        shape: Vec<usize>,
    ) -> Result<NodeIndex, GraphError> {
        if !op.is_placeholder() {
            return Err(GraphError::Invalid {
                file: self.file.clone(),
                node: name.into(),
                message: format!("`{}` is not a placeholder op", op.name()),
            });
        }
        self.insert(Node { op, name: name.into(), layer: layer.into(), phase, shape, inputs: vec![] })
    }

    /// Adds an op node, inferring and checking its shape; errors name the node and the shapes.
    pub fn add(
        &mut self,
        op: Op,
        name: &str,
        layer: &str,
        phase: Phase,
        inputs: &[NodeIndex],
    ) -> Result<NodeIndex, GraphError> {
        if op.is_placeholder() {
            return Err(GraphError::Invalid {
                file: self.file.clone(),
                node: name.into(),
                message: format!("placeholder `{}` added as an op; use `placeholder`", op.name()),
            });
        }
        let shapes: Vec<&[usize]> = inputs.iter().map(|&i| self.graph[i].shape.as_slice()).collect();
        let shape = op.output_shape(&shapes).map_err(|m| GraphError::Shape {
            file: self.file.clone(),
            node: name.into(),
            op: op.name().into(),
            expected: m.expected,
            found: m.found,
        })?;
        self.insert(Node { op, name: name.into(), layer: layer.into(), phase, shape, inputs: inputs.to_vec() })
    }

    fn insert(&mut self, node: Node) -> Result<NodeIndex, GraphError> {
        let numel = node.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if !matches!(numel, Some(n) if n <= MAX_ELEMENTS) {
            return Err(GraphError::Shape {
                file: self.file.clone(),
                node: node.name,
                op: node.op.name().into(),
                expected: format!("at most {MAX_ELEMENTS} elements"),
                found: format!("{:?}", node.shape),
            });
        }
        if self.by_name.contains_key(&node.name) {
            return Err(GraphError::Duplicate { file: self.file.clone(), node: node.name });
        }
        let name = node.name.clone();
        let inputs = node.inputs.clone();
        let i = self.graph.add_node(node);
        for (slot, src) in inputs.into_iter().enumerate() {
            self.graph.add_edge(src, i, slot);
        }
        self.by_name.insert(name, i);
        Ok(i)
    }

    /// The nodes that read node `i`, each once, in index order.
    pub fn readers(&self, i: NodeIndex) -> Vec<NodeIndex> {
        let mut r: Vec<NodeIndex> = self.graph.neighbors_directed(i, petgraph::Direction::Outgoing).collect();
        r.sort();
        r.dedup();
        r
    }

    /// Makes `consumer` read `to` wherever it read `from` (inputs and edges).
    pub(crate) fn redirect(&mut self, consumer: NodeIndex, from: NodeIndex, to: NodeIndex) {
        while let Some(e) = self.graph.find_edge(from, consumer) {
            let slot = self.graph.remove_edge(e).expect("found");
            self.graph.add_edge(to, consumer, slot);
            self.graph[consumer].inputs[slot] = to;
        }
    }

    /// A name not yet used, `base` or `base#2`, `base#3`, ...
    pub fn fresh_name(&self, base: &str) -> String {
        if !self.by_name.contains_key(base) {
            return base.to_string();
        }
        (2..).map(|k| format!("{base}#{k}")).find(|n| !self.by_name.contains_key(n)).expect("unbounded")
    }
}

impl OpGraph {
    /// Graphviz text of the graph: one box per node labelled `name\nop shape`, coloured by phase.
    pub fn to_dot(&self) -> String {
        let mut s = String::from("digraph step {\n  node [shape=box, style=filled, fontname=monospace];\n");
        for i in self.indices() {
            let n = self.node(i);
            let colour = match n.phase {
                Phase::Forward => "#dbe9f6",
                Phase::Backward => "#f6e0db",
                Phase::Update => "#e0f0d8",
            };
            s += &format!(
                "  n{} [label=\"{}\\n{} {:?}\", fillcolor=\"{colour}\"];\n",
                i.index(),
                n.name,
                n.op.name(),
                n.shape
            );
        }
        for e in self.graph.edge_indices() {
            if let Some((a, b)) = self.graph.edge_endpoints(e) {
                s += &format!("  n{} -> n{};\n", a.index(), b.index());
            }
        }
        s + "}\n"
    }
}

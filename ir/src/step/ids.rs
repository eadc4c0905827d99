//! Typed node ids: a `SliceId` cannot be passed where a `PackId` is expected.

use petgraph::graph::NodeIndex;

macro_rules! node_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub(crate) NodeIndex);

        impl $name {
            /// The underlying graph node.
            pub fn node(self) -> NodeIndex {
                self.0
            }
        }
    };
}

node_id!(
    /// A sample (a document or a context-length piece of one).
    SampleId
);
node_id!(
    /// A slice: a token range of one sample.
    SliceId
);
node_id!(
    /// A MicroPack: slices executed together in one direction.
    PackId
);
node_id!(
    /// A pipeline stage.
    StageId
);
node_id!(
    /// A DP replica or a DP-Merge group.
    ReplicaId
);

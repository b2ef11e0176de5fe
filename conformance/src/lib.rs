//! agentdiff-conformance: the suite every runtime backend runs (placeholder).

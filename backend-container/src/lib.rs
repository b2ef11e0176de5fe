//! agentdiff runtime backend `container` (placeholder: registers nothing yet).

//! agentdiff runtime backend `local` (placeholder: registers nothing yet).

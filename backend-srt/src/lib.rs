//! agentdiff runtime backend `srt` (placeholder: registers nothing yet).

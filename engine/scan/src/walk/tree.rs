//! Completing directories: recording entries, and once a directory's last child is in, its tree
//! object (stored, or reused when its stat digest is unchanged).

use super::*;

impl<'o, 'a> Walker<'o, 'a> {
    pub(super) fn record(&mut self, dir: u64, name: &str, e: Entry) {
        if let Some(node) = self.open.get_mut(&dir) {
            if node.tree.entries.insert(name.to_string(), e).is_none() {
                self.held += 1;
                self.max_held = self.max_held.max(self.held);
            }
        }
    }

    pub(super) fn add_pending(&mut self, dir: u64) {
        if let Some(node) = self.open.get_mut(&dir) {
            node.pending += 1;
        }
    }

    /// One of `dir`'s pending items is done; a directory with none left is complete.
    pub(super) fn done_one(&mut self, dir: u64) {
        let Some(node) = self.open.get_mut(&dir) else {
            return;
        };
        node.pending = node.pending.saturating_sub(1);
        if node.pending == 0 {
            self.complete(dir);
        }
    }

    /// Hands a complete directory's tree to the sink, records its id in the parent, and
    /// completes every ancestor that was only waiting for it.
    pub(super) fn complete(&mut self, mut id: u64) {
        loop {
            let Some(node) = self.open.remove(&id) else {
                return;
            };
            self.held = self.held.saturating_sub(node.tree.entries.len());
            if self.sink_error.is_some() {
                return;
            }
            let recorded = node.tree.is_recorded(node.is_entry) || node.parent.is_none();
            let tree_id = if recorded {
                match self.store_tree(&node.rel, node.tree, node.earlier, node.same_stat) {
                    Ok((t, digest)) => {
                        if let (Some(all), Some(d)) = (self.digests.as_mut(), digest) {
                            all.insert(&t, d);
                        }
                        Some(t)
                    }
                    Err(e) => {
                        self.sink_error = Some(e);
                        self.peers.abort(Event::Wake);
                        return;
                    }
                }
            } else {
                None
            };
            let Some((parent, name)) = node.parent else {
                self.root_tree = tree_id;
                self.root_done = true;
                return;
            };
            if let Some(owner) = node.owner {
                // The parent is another walker's; it may have stopped (the scan failed).
                let done = Event::Subtree {
                    dir: parent,
                    name,
                    tree: tree_id,
                };
                let _ = owner.send(done);
                return;
            }
            let Some(p) = self.open.get_mut(&parent) else {
                return;
            };
            if let Some(t) = tree_id {
                p.tree.trees.insert(name, t);
            }
            p.pending = p.pending.saturating_sub(1);
            if p.pending > 0 {
                return;
            }
            id = parent;
        }
    }

    /// Hands one complete directory's tree to the sink: the earlier object when the listing
    /// equals it, else the tree as listed. Returns its id, and its stat digest when digests are
    /// collected.
    pub(super) fn store_tree(
        &mut self,
        rel: &str,
        tree: Tree,
        earlier: Option<Earlier>,
        same_stat: Option<String>,
    ) -> Result<(String, Option<DirDigest>), TreeError> {
        if let Some(id) = same_stat {
            return self.store_same_stat(rel, tree, &id);
        }
        let digest = self.digests.as_ref().and_then(|_| DirDigest::of(&tree));
        let id = match earlier {
            Some(e) if e.tree.tree == tree => {
                self.stats.trees_reused += 1;
                self.sink.lock().unchanged(rel, &e.id, e.tree)?
            }
            _ => self.sink.lock().directory(rel, tree)?,
        };
        Ok((id, digest))
    }

    /// A directory whose entries matched the earlier tree `id`'s stat digest (`tree` holds
    /// placeholders for its files): that tree itself when the subtrees are the same, else its
    /// entries with the new subtrees.
    pub(super) fn store_same_stat(
        &mut self,
        rel: &str,
        tree: Tree,
        id: &str,
    ) -> Result<(String, Option<DirDigest>), TreeError> {
        let reuse = self.reuse.as_ref();
        let (Some(d), Some(src)) = (
            reuse.and_then(|r| r.digest(id)),
            reuse.and_then(Reuse::source),
        ) else {
            return Err(TreeError::Malformed {
                id: id.to_string(),
                reason: "its stat digest is no longer available".into(),
            });
        };
        let collect = self.digests.is_some();
        if d.same_subtrees(&tree.trees) {
            self.stats.trees_reused += 1;
            let id = self.sink.lock().unchanged_unread(rel, id, d.entries, src)?;
            return Ok((id, collect.then(|| d.clone())));
        }
        let entries = src.tree(id)?.entries;
        let tree = Tree {
            entries,
            trees: tree.trees,
        };
        let digest = collect.then(|| DirDigest::of(&tree)).flatten();
        Ok((self.sink.lock().directory(rel, tree)?, digest))
    }
}

//! The plug: writes held back before they are sent, so that neighbours
//! merge into one request and a block written again replaces its bytes in
//! memory (the Linux block layer's plugging, and a disk's volatile cache).
//!
//! Why: every NBD request wakes the server and, for a reply, this process.
//! On a small machine those wake-ups, not the bytes, are the cost: an untar
//! writes a file in `tar`'s 10 KiB records, so each record rewrites the
//! block the last one ended in — and reads it first (the filesystem keeps
//! the block's earlier bytes), a synchronous round trip behind the write
//! still in flight. Held here, the rewrite costs a copy and the read is
//! served from memory; what is sent is a few long writes in offset order.
//!
//! Nothing is promised before a flush (`BlockDevice::write_at`), so holding
//! writes back changes no guarantee: `flush` sends the plug first, and so
//! does every request that must see the server's order (a read the plug
//! covers only in part, a FUA write, a trim). The plug holds at most
//! `PLUG_MAX_BYTES`; past that it is sent.
//!
//! The extents never overlap: a new write cuts what it overlaps out of the
//! older ones, so the newest bytes are the only bytes.

use std::collections::BTreeMap;

/// Bytes held back at most; a write that takes the plug past this sends it.
pub const PLUG_MAX_BYTES: usize = 4 << 20;

/// How a read finds the plug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coverage {
    /// Every byte came from the plug.
    Full,
    /// Some bytes are held here and some are not: send the plug, then read.
    Partial,
    /// None of the range is held here.
    None,
}

/// Held-back writes: offset → bytes, non-overlapping.
#[derive(Default)]
pub struct Plug {
    extents: BTreeMap<u64, Vec<u8>>,
    bytes: usize,
}

impl Plug {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.extents.is_empty()
    }

    /// Hold `data` for bytes `offset..`, replacing what the plug held there.
    pub fn insert(&mut self, offset: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let end = offset + data.len() as u64;
        self.cut(offset, end);
        self.bytes += data.len();
        let previous = self.extents.insert(offset, data.to_vec());
        debug_assert!(previous.is_none(), "the range was cut free");
        debug_assert_eq!(
            self.bytes,
            self.extents.values().map(Vec::len).sum::<usize>()
        );
    }

    /// Remove bytes `start..end` from every extent, keeping the parts
    /// outside the range.
    fn cut(&mut self, start: u64, end: u64) {
        let overlapping: Vec<u64> = self
            .extents
            .range(..end)
            .rev()
            .take_while(|(at, data)| *at + data.len() as u64 > start)
            .map(|(at, _)| *at)
            .collect();
        // Extents do not overlap, so walking back from `end` meets them in
        // order and the first that ends at or before `start` ends the walk.
        for at in overlapping {
            let data = self.extents.remove(&at).expect("listed above");
            self.bytes -= data.len();
            let extent_end = at + data.len() as u64;
            if at < start {
                let head = data[..(start - at) as usize].to_vec();
                self.bytes += head.len();
                self.extents.insert(at, head);
            }
            if extent_end > end {
                let tail = data[(end - at) as usize..].to_vec();
                self.bytes += tail.len();
                self.extents.insert(end, tail);
            }
        }
    }

    /// Copy what the plug holds of `offset..offset+buf.len()` into `buf`
    /// when it holds all of it.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Coverage {
        let end = offset + buf.len() as u64;
        let mut covered = 0u64;
        let mut pieces = Vec::new();
        for (at, data) in self.extents.range(..end).rev() {
            let extent_end = *at + data.len() as u64;
            if extent_end <= offset {
                break;
            }
            let from = (*at).max(offset);
            let to = extent_end.min(end);
            covered += to - from;
            pieces.push((from, to, *at));
        }
        if covered == 0 {
            return Coverage::None;
        }
        if covered < buf.len() as u64 {
            return Coverage::Partial;
        }
        for (from, to, at) in pieces {
            let data = &self.extents[&at];
            buf[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&data[(from - at) as usize..(to - at) as usize]);
        }
        Coverage::Full
    }

    /// Everything held, in offset order, neighbours merged into writes of
    /// at most `max_request` bytes; the plug is empty after.
    pub fn take(&mut self, max_request: usize) -> Vec<(u64, Vec<u8>)> {
        debug_assert!(max_request > 0);
        let mut writes: Vec<(u64, Vec<u8>)> = Vec::new();
        for (at, data) in std::mem::take(&mut self.extents) {
            match writes.last_mut() {
                Some((last_at, last))
                    if *last_at + last.len() as u64 == at
                        && last.len() + data.len() <= max_request =>
                {
                    last.extend_from_slice(&data);
                }
                _ => writes.push((at, data)),
            }
        }
        self.bytes = 0;
        writes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SPAN: u64 = 64 << 10;

    /// The plug against a byte array holding the newest write of each byte.
    #[derive(Debug, Clone)]
    enum Step {
        Write { offset: u64, len: usize, seed: u8 },
        Read { offset: u64, len: usize },
        Take { max_request: usize },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0..SPAN - 1, 1usize..12_000, any::<u8>()).prop_map(|(offset, len, seed)| {
                Step::Write { offset, len: len.min((SPAN - offset) as usize), seed }
            }),
            3 => (0..SPAN - 1, 1usize..12_000).prop_map(|(offset, len)| Step::Read {
                offset,
                len: len.min((SPAN - offset) as usize),
            }),
            1 => (1usize..20_000).prop_map(|max_request| Step::Take { max_request }),
        ]
    }

    proptest! {
        #[test]
        fn the_plug_holds_the_newest_bytes(steps in proptest::collection::vec(step(), 1..60)) {
            let mut plug = Plug::default();
            // None: not held by the plug.
            let mut model: Vec<Option<u8>> = vec![None; SPAN as usize];
            for step in steps {
                match step {
                    Step::Write { offset, len, seed } => {
                        let data: Vec<u8> =
                            (0..len).map(|i| seed.wrapping_add(i as u8)).collect();
                        plug.insert(offset, &data);
                        for (i, byte) in data.iter().enumerate() {
                            model[offset as usize + i] = Some(*byte);
                        }
                    }
                    Step::Read { offset, len } => {
                        let mut buf = vec![0xEE; len];
                        let held = &model[offset as usize..offset as usize + len];
                        let expected = if held.iter().all(Option::is_some) {
                            Coverage::Full
                        } else if held.iter().any(Option::is_some) {
                            Coverage::Partial
                        } else {
                            Coverage::None
                        };
                        prop_assert_eq!(plug.read(offset, &mut buf), expected);
                        if expected == Coverage::Full {
                            let bytes: Vec<u8> = held.iter().map(|b| b.unwrap()).collect();
                            prop_assert_eq!(buf, bytes);
                        }
                    }
                    Step::Take { max_request } => {
                        let held = model.iter().filter(|b| b.is_some()).count();
                        prop_assert_eq!(plug.bytes(), held);
                        let writes = plug.take(max_request);
                        let mut end_before = 0;
                        for (at, data) in &writes {
                            prop_assert!(*at >= end_before, "offset order, no overlap");
                            // Longer than a request only when one write was (the device
                            // splits it into requests).
                            prop_assert!(data.len() <= max_request || data.len() <= 12_000);
                            for (i, byte) in data.iter().enumerate() {
                                prop_assert_eq!(model[*at as usize + i], Some(*byte));
                                model[*at as usize + i] = None;
                            }
                            end_before = at + data.len() as u64;
                        }
                        prop_assert!(model.iter().all(Option::is_none), "everything taken");
                        prop_assert!(plug.is_empty() && plug.bytes() == 0);
                    }
                }
            }
        }
    }

    #[test]
    fn neighbours_merge_and_a_rewrite_replaces_bytes() {
        let mut plug = Plug::default();
        plug.insert(0, &[1; 4096]);
        plug.insert(4096, &[2; 4096]);
        plug.insert(2048, &[3; 4096]);
        assert_eq!(plug.bytes(), 8192);
        let writes = plug.take(1 << 20);
        assert_eq!(writes.len(), 1, "three extents, one write");
        let (at, data) = &writes[0];
        assert_eq!(*at, 0);
        assert_eq!(&data[..2048], &[1; 2048][..]);
        assert_eq!(&data[2048..6144], &[3; 4096][..]);
        assert_eq!(&data[6144..], &[2; 2048][..]);
    }

    #[test]
    fn merged_writes_stay_within_the_request_size() {
        let mut plug = Plug::default();
        for block in 0..10u64 {
            plug.insert(block * 4096, &[block as u8; 4096]);
        }
        let writes = plug.take(3 * 4096);
        let lengths: Vec<usize> = writes.iter().map(|(_, data)| data.len()).collect();
        assert_eq!(lengths, vec![12288, 12288, 12288, 4096]);
    }
}

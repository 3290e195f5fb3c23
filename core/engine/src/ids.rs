//! Sets of sample ids as ranges: the ids a run has trained on (mostly runs of consecutive
//! ids, since the trainer takes the oldest groups first), small enough for every checkpoint.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A set of ids, stored as disjoint half-open ranges `[start, end)`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<[u64; 2]>", into = "Vec<[u64; 2]>")]
pub struct IdRanges {
    /// start → end, disjoint and not touching.
    ranges: BTreeMap<u64, u64>,
    len: u64,
}

impl IdRanges {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add `id`; false if it was there already.
    pub fn insert(&mut self, id: u64) -> bool {
        if self.contains(id) {
            return false;
        }
        let end = id + 1;
        let mut start = id;
        let mut stop = end;
        if let Some((&s, &e)) = self.ranges.range(..=id).next_back()
            && e == id
        {
            start = s;
            self.ranges.remove(&s);
        }
        if let Some(&e) = self.ranges.get(&end) {
            stop = e;
            self.ranges.remove(&end);
        }
        self.ranges.insert(start, stop);
        self.len += 1;
        true
    }

    /// Whether `id` is in the set.
    pub fn contains(&self, id: u64) -> bool {
        self.ranges
            .range(..=id)
            .next_back()
            .is_some_and(|(_, &end)| id < end)
    }

    /// How many ids.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The ranges `[start, end)`, in order.
    pub fn ranges(&self) -> Vec<[u64; 2]> {
        self.ranges.iter().map(|(&s, &e)| [s, e]).collect()
    }
}

impl FromIterator<u64> for IdRanges {
    fn from_iter<I: IntoIterator<Item = u64>>(ids: I) -> Self {
        let mut set = Self::new();
        for id in ids {
            set.insert(id);
        }
        set
    }
}

impl TryFrom<Vec<[u64; 2]>> for IdRanges {
    type Error = String;

    /// Ranges as [`IdRanges::ranges`] gives them: in order, each non-empty, apart.
    fn try_from(ranges: Vec<[u64; 2]>) -> Result<Self, String> {
        let mut set = Self::new();
        let mut last: Option<u64> = None;
        for [start, end] in ranges {
            if start >= end || last.is_some_and(|last| start <= last) {
                return Err(format!(
                    "id range [{start}, {end}) is empty, out of order or touches the one before"
                ));
            }
            set.ranges.insert(start, end);
            set.len += end - start;
            last = Some(end);
        }
        Ok(set)
    }
}

impl From<IdRanges> for Vec<[u64; 2]> {
    fn from(set: IdRanges) -> Self {
        set.ranges()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_round_trip() {
        let mut set = IdRanges::new();
        for id in [5, 3, 4, 10, 0, 11, 1] {
            assert!(set.insert(id), "{id}");
        }
        assert!(!set.insert(4));
        assert_eq!(set.ranges(), vec![[0, 2], [3, 6], [10, 12]]);
        assert_eq!(set.len(), 7);
        assert!(set.contains(11) && !set.contains(2) && !set.contains(12));
        assert!(set.insert(2));
        assert_eq!(set.ranges(), vec![[0, 6], [10, 12]]);
        let json = serde_json::to_string(&set).unwrap();
        assert_eq!(json, "[[0,6],[10,12]]");
        let back: IdRanges = serde_json::from_str(&json).unwrap();
        assert_eq!(back, set);
        assert_eq!(back.len(), 8);
        for bad in ["[[3,3]]", "[[4,6],[0,2]]", "[[0,2],[2,3]]"] {
            assert!(serde_json::from_str::<IdRanges>(bad).is_err(), "{bad}");
        }
    }
}

//! The part of a class's (element, cycle) plane a campaign samples: a union of rectangles (the
//! live windows, widened to every anchor whose fault can reach one), cut into disjoint
//! rectangles so that a uniform draw over it is one number.

use std::ops::Range;

/// A union of (elements x cycles) rectangles as disjoint rectangles, with their running areas.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Region {
    /// Disjoint rectangles: elements, cycles.
    rects: Vec<(Range<u64>, Range<u64>)>,
    /// `ends[i]`: the area of rectangles `0..=i`.
    ends: Vec<u64>,
}

impl Region {
    /// The union of `rects` (overlapping or not, in any order), cut along element boundaries:
    /// each band of elements that the same rectangles cover becomes one rectangle per run of
    /// their cycles, so the result does not depend on the order given.
    pub fn union(rects: impl IntoIterator<Item = (Range<u64>, Range<u64>)>) -> Region {
        let mut rects: Vec<_> = rects.into_iter().filter(|(e, c)| !e.is_empty() && !c.is_empty()).collect();
        rects.sort_by_key(|(e, c)| (e.start, e.end, c.start, c.end));
        let mut bounds: Vec<u64> = rects.iter().flat_map(|(e, _)| [e.start, e.end]).collect();
        bounds.sort_unstable();
        bounds.dedup();
        let mut out = Region::default();
        // Sweep the element bands in order, keeping the rectangles that cover the current one.
        let (mut next, mut active): (usize, Vec<usize>) = (0, Vec::new());
        for band in bounds.windows(2) {
            let (lo, hi) = (band[0], band[1]);
            active.retain(|&i| rects[i].0.end > lo);
            while next < rects.len() && rects[next].0.start <= lo {
                active.push(next);
                next += 1;
            }
            let mut cycles: Vec<Range<u64>> = active.iter().map(|&i| rects[i].1.clone()).collect();
            cycles.sort_by_key(|c| (c.start, c.end));
            let mut runs: Vec<Range<u64>> = Vec::new();
            for c in cycles {
                match runs.last_mut() {
                    Some(r) if c.start <= r.end => r.end = r.end.max(c.end),
                    _ => runs.push(c),
                }
            }
            for r in runs {
                out.push(lo..hi, r);
            }
        }
        out
    }

    /// The whole plane `elements x cycles`.
    pub fn all(elements: u64, cycles: u64) -> Region {
        Region::union([(0..elements, 0..cycles)])
    }

    fn push(&mut self, elems: Range<u64>, cycles: Range<u64>) {
        // Join a band to the one above it when they cover the same cycles: fewer rectangles.
        if let Some((e, c)) = self.rects.last_mut() {
            if e.end == elems.start && *c == cycles {
                let added = (elems.end - elems.start) * (cycles.end - cycles.start);
                e.end = elems.end;
                *self.ends.last_mut().expect("one end per rectangle") += added;
                return;
            }
        }
        let area = (elems.end - elems.start) * (cycles.end - cycles.start);
        self.ends.push(self.area() + area);
        self.rects.push((elems, cycles));
    }

    /// (element, cycle) pairs in it.
    pub fn area(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// Pair `k` of it (`k < area()`), rectangle after rectangle, element-major in each.
    pub fn at(&self, k: u64) -> (u64, u64) {
        let i = self.ends.partition_point(|&end| end <= k);
        let (e, c) = &self.rects[i];
        let off = k - if i == 0 { 0 } else { self.ends[i - 1] };
        let len = c.end - c.start;
        (e.start + off / len, c.start + off % len)
    }

    /// Whether it holds (element, cycle).
    pub fn contains(&self, elem: u64, cycle: u64) -> bool {
        self.rects.iter().any(|(e, c)| e.contains(&elem) && c.contains(&cycle))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn overlapping_rectangles_count_once() {
        let r = Region::union([(0..4, 0..10), (2..6, 5..20), (10..12, 0..1)]);
        // 4 x 10 + 4 x 15 - 2 x 5 (the overlap) + 2.
        assert_eq!(r.area(), 40 + 60 - 10 + 2);
        assert!(r.contains(3, 15) && !r.contains(1, 15) && !r.contains(8, 0));
        assert_eq!(Region::all(3, 7).area(), 21);
        assert_eq!(Region::union([]).area(), 0);
    }

    proptest! {
        /// The union's pairs are exactly those some rectangle holds, each drawn by one `k`.
        #[test]
        fn union_enumerates_each_pair_once(rects in prop::collection::vec((0u64..12, 1u64..6, 0u64..12, 1u64..6), 0..6)) {
            let rects: Vec<_> = rects.into_iter().map(|(e, de, c, dc)| (e..e + de, c..c + dc)).collect();
            let r = Region::union(rects.clone());
            let inside = |e: u64, c: u64| rects.iter().any(|(x, y)| x.contains(&e) && y.contains(&c));
            let want: Vec<(u64, u64)> = (0..20).flat_map(|e| (0..20).map(move |c| (e, c))).filter(|&(e, c)| inside(e, c)).collect();
            let mut got: Vec<(u64, u64)> = (0..r.area()).map(|k| r.at(k)).collect();
            got.sort_unstable();
            prop_assert_eq!(got, want);
        }
    }
}

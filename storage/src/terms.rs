//! Conjunctions over postings: for each dimension, the terms one of which a row must hold
//! (`model = 'a' AND worker IN ('w1', 'w2')`), and how a block's rows are found for them.

use std::borrow::Cow;

use roaring::RoaringBitmap;

/// For each dimension, the terms one of which a row must hold. Built once per query; its
/// text names it in caches (dimensions and terms in order, so equal filters have one name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TermFilter {
    dims: Vec<(String, Vec<String>)>,
    text: Vec<u8>,
}

impl TermFilter {
    pub fn new<'a>(dims: impl IntoIterator<Item = (&'a str, &'a [String])>) -> Self {
        let mut dims: Vec<(String, Vec<String>)> = dims
            .into_iter()
            .map(|(d, terms)| {
                let mut terms = terms.to_vec();
                terms.sort_unstable();
                terms.dedup();
                (d.to_owned(), terms)
            })
            .collect();
        dims.sort_unstable();
        // lengths before bytes: no dimension or term can run into the next
        let mut text = Vec::new();
        for (d, terms) in &dims {
            text.extend_from_slice(&(d.len() as u32).to_le_bytes());
            text.extend_from_slice(d.as_bytes());
            text.extend_from_slice(&(terms.len() as u32).to_le_bytes());
            for t in terms {
                text.extend_from_slice(&(t.len() as u32).to_le_bytes());
                text.extend_from_slice(t.as_bytes());
            }
        }
        Self { dims, text }
    }

    pub fn dims(&self) -> &[(String, Vec<String>)] {
        &self.dims
    }

    pub fn is_empty(&self) -> bool {
        self.dims.is_empty()
    }

    /// The filter's name, unique to its dimensions and terms.
    pub fn text(&self) -> &[u8] {
        &self.text
    }
}

/// The rows of one dimension's postings holding one of `terms`: the term's own bitmap when
/// one matches (no copy), else their union.
pub fn rows_with_any<'a>(
    postings: &'a [(String, RoaringBitmap)],
    terms: &[String],
) -> Cow<'a, RoaringBitmap> {
    let mut matched = postings
        .iter()
        .filter(|(t, _)| terms.binary_search(t).is_ok())
        .map(|(_, rows)| rows);
    match (matched.next(), matched.next()) {
        (None, _) => Cow::Owned(RoaringBitmap::new()),
        (Some(one), None) => Cow::Borrowed(one),
        (Some(a), Some(b)) => {
            let mut union = a | b;
            for rows in matched {
                union |= rows;
            }
            Cow::Owned(union)
        }
    }
}

/// The intersection of `sets`, smallest first: each step is no longer than its smaller side,
/// and borrowed bitmaps are read, not copied. No set at all is no filter: every row of a
/// block of `rows` rows.
pub fn intersect(mut sets: Vec<Cow<'_, RoaringBitmap>>, rows: u32) -> RoaringBitmap {
    sets.sort_by_key(|s| s.len());
    let mut sets = sets.into_iter();
    let mut acc = match (sets.next(), sets.next()) {
        (None, _) => return (0..rows).collect(),
        (Some(s), None) => return s.into_owned(),
        (Some(s), Some(t)) => s.as_ref() & t.as_ref(),
    };
    for s in sets {
        if acc.is_empty() {
            break;
        }
        acc &= s.as_ref();
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bitmap(rows: &[u32]) -> RoaringBitmap {
        rows.iter().copied().collect()
    }

    #[test]
    fn filters_name_their_terms_whatever_the_order() {
        let a = ["x".to_owned(), "y".to_owned()];
        let b = ["y".to_owned(), "x".to_owned(), "x".to_owned()];
        let one = TermFilter::new([("model", &a[..]), ("worker", &a[..1])]);
        let two = TermFilter::new([("worker", &b[1..2]), ("model", &b[..])]);
        assert_eq!(one.text(), two.text());
        let other = TermFilter::new([("model", &a[..]), ("worker", &a[1..])]);
        assert_ne!(one.text(), other.text());
        // a term that looks like a dimension boundary stays a term
        let joined = ["ab".to_owned()];
        let split = ["a".to_owned()];
        assert_ne!(
            TermFilter::new([("d", &joined[..])]).text(),
            TermFilter::new([("d", &split[..]), ("b", &split[..])]).text()
        );
    }

    #[test]
    fn rows_are_the_union_per_dimension_and_the_intersection_across() {
        let postings = vec![
            ("a".to_owned(), bitmap(&[1, 2, 3])),
            ("b".to_owned(), bitmap(&[4, 70_000])),
            ("c".to_owned(), bitmap(&[5])),
        ];
        let terms = |t: &[&str]| {
            let mut v: Vec<String> = t.iter().map(|s| s.to_string()).collect();
            v.sort();
            v
        };
        assert_eq!(
            *rows_with_any(&postings, &terms(&["b"])),
            bitmap(&[4, 70_000])
        );
        assert_eq!(
            *rows_with_any(&postings, &terms(&["c", "a"])),
            bitmap(&[1, 2, 3, 5])
        );
        assert!(rows_with_any(&postings, &terms(&["z"])).is_empty());
        let sets = vec![
            Cow::Owned(bitmap(&[1, 2, 3, 4, 5, 70_000])),
            Cow::Owned(bitmap(&[2, 4, 70_000])),
            Cow::Owned(bitmap(&[4, 70_000, 80_000])),
        ];
        assert_eq!(intersect(sets, 100_000), bitmap(&[4, 70_000]));
        assert_eq!(intersect(vec![Cow::Owned(bitmap(&[9]))], 10), bitmap(&[9]));
        assert_eq!(intersect(Vec::new(), 3), bitmap(&[0, 1, 2]));
        let none = vec![
            Cow::Owned(bitmap(&[1])),
            Cow::Owned(bitmap(&[2])),
            Cow::Owned(bitmap(&[1])),
        ];
        assert!(intersect(none, 10).is_empty());
    }
}

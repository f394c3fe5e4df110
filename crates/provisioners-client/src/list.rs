//! `a, b, c and 5 more`: how every message of the leaves names a list
//! too long to print in full.
//!
//! ```
//! use provisioners_client::list::{self, List};
//!
//! assert_eq!(list::and_more(["a", "b", "c", "d"], 2), "a, b and 2 more");
//! assert_eq!(list::and_more(["a", "b"], 2), "a, b");
//! // Items that hold commas themselves are kept apart by `; `.
//! let managers = List::new(1).separator("; ").noun("managers");
//! assert_eq!(managers.of(["x: .a, .b", "y: .c", "z: .d"]), "x: .a, .b; and 2 more managers");
//! // When only the first few were kept, the total says how many there were.
//! assert_eq!(List::new(8).separator("; ").of_total(["a", "b"], 5), "a; b; and 3 more");
//! ```

use std::fmt::{Display, Write as _};

/// The first `shown` of `items` joined by `, `, then ` and N more` when
/// some were left out.
#[must_use]
pub fn and_more<T: Display>(items: impl IntoIterator<Item = T>, shown: usize) -> String {
    List::new(shown).of(items)
}

/// How a list is shown: how many items at most, what comes between them,
/// and what the rest are called (`and 3 more managers`).
#[derive(Clone, Copy, Debug)]
pub struct List {
    shown: usize,
    separator: &'static str,
    noun: &'static str,
}

impl List {
    /// At most `shown` items, `, ` between them.
    #[must_use]
    pub const fn new(shown: usize) -> Self {
        Self {
            shown,
            separator: ", ",
            noun: "",
        }
    }

    /// What goes between two items. The tail is ` and N more` after `, `
    /// and `{separator}and N more` after any other.
    #[must_use]
    pub const fn separator(self, separator: &'static str) -> Self {
        Self { separator, ..self }
    }

    /// What the rest are called: `and 3 more {noun}`.
    #[must_use]
    pub const fn noun(self, noun: &'static str) -> Self {
        Self { noun, ..self }
    }

    /// `items`, at most [`new`](List::new)'s `shown` of them, and how many
    /// more there are.
    #[must_use]
    pub fn of<T: Display>(&self, items: impl IntoIterator<Item = T>) -> String {
        let mut out = String::new();
        let mut total = 0;
        for item in items {
            if total < self.shown {
                if total > 0 {
                    out.push_str(self.separator);
                }
                let _ = write!(out, "{item}");
            }
            total += 1;
        }
        self.tail(&mut out, total.saturating_sub(self.shown));
        out
    }

    /// As [`of`](List::of) for the items kept of `total`: what was not
    /// kept counts among the rest.
    #[must_use]
    pub fn of_total<T: Display>(&self, items: impl IntoIterator<Item = T>, total: usize) -> String {
        let mut out = String::new();
        let mut listed = 0;
        for item in items.into_iter().take(self.shown) {
            if listed > 0 {
                out.push_str(self.separator);
            }
            let _ = write!(out, "{item}");
            listed += 1;
        }
        self.tail(&mut out, total.saturating_sub(listed));
        out
    }

    fn tail(&self, out: &mut String, more: usize) {
        if more == 0 {
            return;
        }
        if out.is_empty() {
            let _ = write!(out, "and {more} more");
        } else if self.separator == ", " {
            let _ = write!(out, " and {more} more");
        } else {
            let _ = write!(out, "{}and {more} more", self.separator);
        }
        if !self.noun.is_empty() {
            out.push(' ');
            out.push_str(self.noun);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_list_longer_than_shown_has_a_tail() {
        let items: Vec<String> = (0..10).map(|i| i.to_string()).collect();
        assert_eq!(and_more(&items, 8), "0, 1, 2, 3, 4, 5, 6, 7 and 2 more");
        assert_eq!(and_more(&items[..8], 8), "0, 1, 2, 3, 4, 5, 6, 7");
        assert_eq!(and_more(Vec::<String>::new(), 8), "");
        assert_eq!(
            List::new(3).separator(" | ").noun("lines").of(&items[..5]),
            "0 | 1 | 2 | and 2 more lines"
        );
    }

    #[test]
    fn the_total_counts_what_was_not_kept() {
        assert_eq!(List::new(2).of_total(["a", "b"], 2), "a, b");
        assert_eq!(List::new(2).of_total(["a", "b", "c"], 7), "a, b and 5 more");
        assert_eq!(and_more(["a", "b"], 0), "and 2 more");
    }
}

//! A static estimate of what one CEL selector costs against one device, made when it is
//! compiled, before it ever runs. card-quota's watchers count every claim's, template's
//! and DeviceClass's selectors against every published card device; a selector whose
//! estimate is past [`MAX_COST_PER_DEVICE`] is refused (its object's pods are refused
//! with the reason), so no tenant's expression costs the watchers work out of proportion
//! to the devices it is read against.
//!
//! The estimate follows Kubernetes' own (one unit per operation, a comprehension's body
//! times the largest size of what it iterates), with the bounds a device gives: at most
//! [`DEVICE_FIELDS`] attributes and capacities, strings of at most [`ATTRIBUTE_STRING`]
//! characters. What it cannot size (a comprehension's element, a function's result) it
//! takes as large as a device's fields; a list built inside an expression and iterated
//! by a nested comprehension is sized that way too, so such an estimate is not a bound.
//! Kubernetes refuses a selector past 1,000,000 units; card-quota's limit is lower,
//! because it evaluates each selector against every device of the cluster, not only
//! against the devices of a node being scheduled.

use cel::common::ast::{EntryExpr, Expr, IdedExpr};

/// The most a selector may cost against one device (Kubernetes: 1,000,000).
pub const MAX_COST_PER_DEVICE: u64 = 10_000;
/// Attributes and capacities of one device, at most (Kubernetes' limit per device).
const DEVICE_FIELDS: u64 = 32;
/// The longest attribute string Kubernetes accepts.
const ATTRIBUTE_STRING: u64 = 64;

/// An expression's cost, and the most elements (or characters) its value may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    pub cost: u64,
    pub size: u64,
}

/// The estimate of `e`.
pub fn estimate(e: &IdedExpr) -> Estimate {
    match &e.expr {
        Expr::Unspecified => Estimate { cost: 1, size: 1 },
        Expr::Literal(l) => Estimate {
            cost: 1,
            size: literal_size(l),
        },
        // A variable (`device`, a comprehension's element or accumulator) or a field of
        // one: a map of at most a device's fields, or a string of at most an attribute's
        // length (CEL iterates no strings: the larger bound sizes the work of reading one).
        Expr::Ident(_) => Estimate {
            cost: 1,
            size: DEVICE_FIELDS.max(ATTRIBUTE_STRING),
        },
        Expr::Select(s) => {
            let operand = estimate(&s.operand);
            Estimate {
                cost: operand.cost.saturating_add(1),
                size: DEVICE_FIELDS.max(ATTRIBUTE_STRING),
            }
        }
        Expr::List(l) => {
            let cost = l
                .elements
                .iter()
                .fold(1u64, |c, x| c.saturating_add(estimate(x).cost));
            Estimate {
                cost,
                size: l.elements.len() as u64,
            }
        }
        Expr::Map(m) => entries(m.entries.iter()),
        Expr::Struct(s) => entries(s.entries.iter()),
        Expr::Call(c) => {
            let parts: Vec<Estimate> = c
                .target
                .iter()
                .map(|t| estimate(t))
                .chain(c.args.iter().map(estimate))
                .collect();
            let cost = parts.iter().fold(1u64, |a, p| a.saturating_add(p.cost));
            let largest = parts.iter().map(|p| p.size).max().unwrap_or(1);
            // Concatenation, comparison and string tests read their operands whole, a
            // tenth of a unit per element or character as Kubernetes counts them; other
            // functions (sizes, arithmetic) are sized by their largest argument.
            let read = largest / 10;
            let (work, size) = match c.func_name.as_str() {
                "_+_" => (
                    read,
                    parts.iter().fold(0u64, |a, p| a.saturating_add(p.size)),
                ),
                "_==_" | "_!=_" | "matches" | "contains" | "startsWith" | "endsWith" => (read, 1),
                _ => (0, largest),
            };
            Estimate {
                cost: cost.saturating_add(work),
                size,
            }
        }
        Expr::Comprehension(c) => {
            let mut range = estimate(&c.iter_range);
            // What a comprehension iterates is a list or a map: of a device, at most its
            // fields; a literal, its own length.
            if !matches!(c.iter_range.expr, Expr::List(_) | Expr::Map(_)) {
                range.size = range
                    .size
                    .min(DEVICE_FIELDS.max(range_of_lists(&c.iter_range)));
            }
            let init = estimate(&c.accu_init);
            let cond = estimate(&c.loop_cond);
            let step = estimate(&c.loop_step);
            let result = estimate(&c.result);
            let per_element = cond.cost.saturating_add(step.cost);
            Estimate {
                cost: range
                    .cost
                    .saturating_add(init.cost)
                    .saturating_add(range.size.saturating_mul(per_element))
                    .saturating_add(result.cost),
                // `map` and `filter` make a list up to the range's size.
                size: range.size.max(1),
            }
        }
    }
}

/// The size of a list a comprehension builds from literals (`[..].map(..)`), 0 when
/// the range is not made of literal lists.
fn range_of_lists(e: &IdedExpr) -> u64 {
    match &e.expr {
        Expr::List(l) => l.elements.len() as u64,
        Expr::Comprehension(c) => range_of_lists(&c.iter_range),
        Expr::Call(c) if c.func_name == "_+_" => c.args.iter().map(range_of_lists).sum(),
        _ => 0,
    }
}

fn entries<'a>(entries: impl Iterator<Item = &'a cel::common::ast::IdedEntryExpr>) -> Estimate {
    let mut cost = 1u64;
    let mut size = 0u64;
    for e in entries {
        size += 1;
        cost = match &e.expr {
            EntryExpr::StructField(f) => cost.saturating_add(estimate(&f.value).cost),
            EntryExpr::MapEntry(m) => cost
                .saturating_add(estimate(&m.key).cost)
                .saturating_add(estimate(&m.value).cost),
        };
    }
    Estimate { cost, size }
}

fn literal_size(l: &cel::common::ast::LiteralValue) -> u64 {
    use cel::common::ast::LiteralValue;
    match l {
        LiteralValue::String(s) => s.len() as u64,
        LiteralValue::Bytes(b) => b.len() as u64,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(expression: &str) -> u64 {
        let program = cel::Env::stdlib().compile(expression).unwrap();
        estimate(program.expression()).cost
    }

    #[test]
    fn ordinary_selectors_cost_little() {
        for e in [
            "device.driver == 'gpu.nvidia.com'",
            "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200' && device.attributes['gpu.nvidia.com'].index != 3",
            "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA')",
            "'gpu.nvidia.com' in device.attributes && device.attributes['gpu.nvidia.com'].type == 'gpu'",
            "device.attributes['gpu.nvidia.com'].exists(k, k == 'uuid')",
        ] {
            let c = cost(e);
            assert!(c < 1_000, "{e}: {c}");
        }
    }

    /// The selector of e2e/run.sh's costly claim (7.1 s of CPU over 392 devices before
    /// this limit): two nested comprehensions over lists of 100.
    #[test]
    fn nested_comprehensions_over_long_lists_are_past_the_limit() {
        let list = format!(
            "[{}]",
            (0..100)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        let e = format!(
            "{list}.all(i, {list}.all(j, device.attributes['gpu.nvidia.com'].productName.size() + i + j >= 0))"
        );
        let c = cost(&e);
        assert!(c > MAX_COST_PER_DEVICE, "{c}");
        // One level of it is within.
        let one = format!("{list}.all(i, i >= 0)");
        assert!(cost(&one) < MAX_COST_PER_DEVICE, "{}", cost(&one));
    }
}

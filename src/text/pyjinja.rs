//! The Python side of Hugging Face chat templates, for `minijinja`:
//! `tojson` as transformers defines it (`json.dumps` with
//! `ensure_ascii=False`, `indent`, `separators`, `sort_keys`), and the
//! `raise_exception` / `strftime_now` globals.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};
use std::fmt::Write;

/// `raise_exception(message)`: the template refuses its input.
pub(crate) fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current time (UTC) formatted like Python's
/// `datetime.strftime`.
pub(crate) fn strftime_now(format: String) -> Result<Value, Error> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(Value::from(strftime(&format, now.as_secs() as i64)))
}

/// Python-style `strftime` of a UTC unix time, for the specifiers chat
/// templates use (`%Y %y %m %d %e %B %b %A %a %H %I %M %S %p %j %%`);
/// any other specifier is copied as written.
pub(crate) fn strftime(format: &str, unix_secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(spec) = chars.next() else {
            out.push('%');
            break;
        };
        let m = MONTHS[month as usize - 1];
        let d = DAYS[weekday];
        let _ = match spec {
            'Y' => write!(out, "{year}"),
            'y' => write!(out, "{:02}", year.rem_euclid(100)),
            'm' => write!(out, "{month:02}"),
            'd' => write!(out, "{day:02}"),
            'e' => write!(out, "{day:>2}"),
            'B' => write!(out, "{m}"),
            'b' => write!(out, "{}", &m[..3]),
            'A' => write!(out, "{d}"),
            'a' => write!(out, "{}", &d[..3]),
            'H' => write!(out, "{hour:02}"),
            'I' => write!(out, "{hour12:02}"),
            'M' => write!(out, "{minute:02}"),
            'S' => write!(out, "{second:02}"),
            'p' => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            'j' => write!(out, "{yday:03}"),
            '%' => write!(out, "%"),
            other => write!(out, "%{other}"),
        };
    }
    out
}

/// (year, month, day) of a day count since 1970-01-01 (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// How `json.dumps` lays out its output.
struct JsonStyle {
    ensure_ascii: bool,
    /// `None`: one line. `Some(s)`: one item per line, indented by `s` per level.
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// The `tojson` filter as transformers defines it:
/// `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
pub(crate) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_usize(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(n)),
            (None, Some(s)) => Some(s.to_string()),
            _ => return Err(bad_arg("indent must be an integer or a string")),
        },
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Value>>("separators")? {
        Some(v) if !v.is_none() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] => match (a.as_str(), b.as_str()) {
                    (Some(a), Some(b)) => (a.to_string(), b.to_string()),
                    _ => return Err(bad_arg("separators must be two strings")),
                },
                _ => return Err(bad_arg("separators must be two strings")),
            }
        }
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    kwargs.assert_all_used()?;
    let style = JsonStyle {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    let mut out = String::new();
    write_json(&mut out, value, &style, 0)?;
    Ok(Value::from_safe_string(out))
}

fn bad_arg(msg: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("tojson: {msg}"))
}

fn not_serializable(value: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("tojson: a value of kind {} is not JSON serializable", value.kind()),
    )
}

fn newline(out: &mut String, style: &JsonStyle, depth: usize) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

fn write_json(out: &mut String, value: &Value, style: &JsonStyle, depth: usize) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => {
            let _ = write!(out, "{value}");
        }
        ValueKind::Number => {
            let x = f64::try_from(value.clone())?;
            out.push_str(&python_float(x, true));
        }
        ValueKind::String => write_json_str(out, value.as_str().unwrap_or_default(), style.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, style, depth, '[', ']', &items, |out, item| {
                write_json(out, item, style, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((json_key(&key)?, item));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, style, depth, '{', '}', &entries, |out, (key, item)| {
                write_json_str(out, key, style.ensure_ascii);
                out.push_str(&style.key_sep);
                write_json(out, item, style, depth + 1)
            })?;
        }
        _ => return Err(not_serializable(value)),
    }
    Ok(())
}

fn write_container<T>(
    out: &mut String,
    style: &JsonStyle,
    depth: usize,
    open: char,
    close: char,
    items: &[T],
    mut write_item: impl FnMut(&mut String, &T) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        newline(out, style, depth + 1);
        write_item(out, item)?;
    }
    newline(out, style, depth);
    out.push(close);
    Ok(())
}

/// A map key as `json.dumps` writes it: strings as they are, numbers,
/// booleans and `None` as their JSON text.
fn json_key(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::None => "null".to_string(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_string(),
        ValueKind::Number if key.is_integer() => key.to_string(),
        ValueKind::Number => python_float(f64::try_from(key.clone())?, true),
        _ => return Err(not_serializable(key)),
    })
}

fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest digits that round-trip, in fixed
/// notation when the decimal exponent is in `[-4, 16)`, else `1e-05` /
/// `1.5e+16` style. `json` spells the non-finite values `NaN`/`Infinity`.
pub(crate) fn python_float(x: f64, json: bool) -> String {
    if x.is_nan() {
        return (if json { "NaN" } else { "nan" }).to_string();
    }
    if x.is_infinite() {
        let sign = if x < 0.0 { "-" } else { "" };
        return format!("{sign}{}", if json { "Infinity" } else { "inf" });
    }
    // `{:e}` gives the shortest round-trip digits: "-1.2345e-7".
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let n = digits.len() as i32;
    let point = exp + 1; // digits are 0.d1d2... × 10^point
    let sign = if x.is_sign_negative() { "-" } else { "" };
    let body = if (-3..=16).contains(&point) {
        if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point >= n {
            format!("{digits}{}.0", "0".repeat((point - n) as usize))
        } else {
            format!("{}.{}", &digits[..point as usize], &digits[point as usize..])
        }
    } else {
        let rest = &digits[1..];
        let dot = if rest.is_empty() { "" } else { "." };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{}{dot}{rest}e{esign}{:02}", &digits[..1], exp.abs())
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_known_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t), "2024-02-29 13:05:09");
        assert_eq!(
            strftime("%d %b %Y, %A %I%p %j %y %%", t),
            "29 Feb 2024, Thursday 01PM 060 24 %"
        );
        assert_eq!(strftime("%B %e %a", 0), "January  1 Thu");
        assert_eq!(strftime("%Y-%m-%d", -86_400), "1969-12-31");
    }

    #[test]
    fn python_float_repr() {
        let cases = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (100.0, "100.0"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (1e-5, "1e-05"),
            (3e-7, "3e-07"),
            (12345678.9, "12345678.9"),
            (1e16, "1e+16"),
            (9999999999999998.0, "9999999999999998.0"),
            (1.152921504606847e18, "1.152921504606847e+18"),
            (1e22, "1e+22"),
            (1.5e300, "1.5e+300"),
            (-2.5e-10, "-2.5e-10"),
        ];
        for (x, want) in cases {
            assert_eq!(python_float(x, true), want, "{x:e}");
        }
        assert_eq!(python_float(f64::NAN, true), "NaN");
        assert_eq!(python_float(f64::NEG_INFINITY, true), "-Infinity");
    }
}

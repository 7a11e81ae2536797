//! CSV exports of what a page lists (`/machines.csv`, `/reservations.csv`,
//! `/demand.csv`), for the datacenter team's spreadsheets: RFC 4180 quoting,
//! and no cell that a spreadsheet would run as a formula.

use actix_web::HttpResponse;
use actix_web::http::header;

/// Rows an export holds at most: more than any organization's pool here
/// (BENCHMARKS.md measures 50,000 machines); the last row says when cut.
pub const MAX_ROWS: i64 = 100_000;

/// One cell: a text that a spreadsheet would read as a formula (`=`, `+`,
/// `-`, `@`, or a tab or carriage return before one) gets a leading `'`, so
/// that it stays text (OWASP "CSV injection"); then quoted when it holds a
/// comma, a quote or a line break.
pub fn cell(value: &str) -> String {
    let guarded = if value.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{value}")
    } else {
        value.to_owned()
    };
    if guarded.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", guarded.replace('"', "\"\""))
    } else {
        guarded
    }
}

/// The whole file: a header line, then the rows, CRLF line ends.
pub fn render(columns: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut out = String::new();
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = String>| {
        let cells: Vec<String> = cells.map(|c| cell(&c)).collect();
        out.push_str(&cells.join(","));
        out.push_str("\r\n");
    };
    line(&mut out, &mut columns.iter().map(|c| (*c).to_owned()));
    for row in rows {
        line(&mut out, &mut row.into_iter());
    }
    out
}

/// An attachment named `filename`, never cached.
pub fn response(filename: &str, body: String) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/csv; charset=utf-8")
        .insert_header((
            header::CONTENT_DISPOSITION,
            format!("attachment; filename=\"{filename}\""),
        ))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .body(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formulas_stay_text_and_quotes_are_doubled() {
        assert_eq!(cell("PK-1"), "PK-1");
        assert_eq!(cell("=HYPERLINK(\"x\")"), "\"'=HYPERLINK(\"\"x\"\")\"");
        assert_eq!(cell("+1"), "'+1");
        assert_eq!(cell("-1"), "'-1");
        assert_eq!(cell("@SUM(A1)"), "'@SUM(A1)");
        assert_eq!(cell("a,b"), "\"a,b\"");
        assert_eq!(cell("two\nlines"), "\"two\nlines\"");
        assert_eq!(cell(""), "");
        assert_eq!(
            render(&["a", "b"], [vec!["1".into(), "x,y".into()]]),
            "a,b\r\n1,\"x,y\"\r\n"
        );
    }
}

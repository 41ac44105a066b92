"""The chat page: a browser's `GET /` (static HTML, CSS and JavaScript shipped with the
package; no build step, nothing fetched from elsewhere)."""

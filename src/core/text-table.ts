// Aligned plain-text tables for terminal output (`llmgw ctl`): columns padded to their
// widest cell, two spaces apart, missing values shown as "-".
export function renderTable(headers: readonly string[], rows: ReadonlyArray<ReadonlyArray<string | number | null | undefined>>): string {
  const cells = rows.map((row) => row.map((cell) => (cell === null || cell === undefined ? "-" : String(cell))));
  const widths = headers.map((header, i) => Math.max(header.length, ...cells.map((row) => row[i]?.length ?? 0)));
  const line = (row: readonly string[]) =>
    row
      .map((cell, i) => (i === row.length - 1 ? cell : cell.padEnd(widths[i]!)))
      .join("  ")
      .trimEnd();
  return [line(headers), ...cells.map(line)].join("\n");
}

// Command-line flags of the benchmark scripts: `--name VALUE`, else the environment
// variable, else undefined (the script's default). A flag without a value is an error.
export function flagReader(argv: readonly string[]): (name: string, env: string) => string | undefined {
  return (name, env) => {
    const index = argv.indexOf(`--${name}`);
    if (index !== -1) {
      const value = argv[index + 1];
      if (value === undefined || value.startsWith("--")) throw new Error(`--${name} needs a value.`);
      return value;
    }
    return process.env[env];
  };
}

/** A flag's value as a whole number of at least `min`; an error naming the flag otherwise. */
export function wholeNumber(value: string, name: string, min = 1): number {
  const number = Number(value);
  if (value.trim() === "" || !Number.isInteger(number) || number < min) throw new Error(`Invalid --${name} '${value}': expected a whole number ≥ ${min}.`);
  return number;
}

// What a request costs in USD, from the model's prices (per million tokens, input and
// output). The one place that turns tokens into money, for budgets, usage and metrics.
import type { TokenUsage } from "../core/token-usage.ts";

export interface Prices {
  input_per_million: number;
  output_per_million: number;
}

export function costUsd(prices: Prices, usage: TokenUsage): number {
  return (usage.prompt_tokens * prices.input_per_million + usage.completion_tokens * prices.output_per_million) / 1_000_000;
}

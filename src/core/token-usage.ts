// The token counts of one answer, as an upstream reported them: the one shape the gateway
// reads (gateway/usage-tap.ts), the policy prices and settles (policy/), and the metrics
// add up. It lives in core so that the policy, which the gateway asks, never has to import
// the gateway to name it.
export interface TokenUsage {
  prompt_tokens: number;
  completion_tokens: number;
}

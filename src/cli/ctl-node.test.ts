// What `ctl node drain` and `undrain` say: the replica count and its verb agree (one
// replica stops, two stop), a node without replicas says so, and an undrained node that is
// lost says when it takes replicas again.
import { test } from "node:test";
import assert from "node:assert/strict";
import { describeDrain, describeUndrain, type NodeView } from "./ctl-node.ts";

const replica = (id: string): NodeView["replicas"][number] => ({ id, model: "tiny", state: "ready", profile: "cpu" });

test("drain: the count of replicas and the verb agree", () => {
  assert.match(
    describeDrain({ name: "gpu-01", replicas: [replica("r-1")] }),
    /^Node 'gpu-01' is draining: nothing new is placed there, and its 1 replica stops once replaced elsewhere \(it keeps running if there is no room elsewhere\)\./,
  );
  assert.match(
    describeDrain({ name: "gpu-01", replicas: [replica("r-1"), replica("r-2")] }),
    /and its 2 replicas stop once replaced elsewhere \(those without room elsewhere keep running\)\./,
  );
  assert.match(describeDrain({ name: "gpu-01", replicas: [] }), /^Node 'gpu-01' is draining: nothing new is placed there, and it runs no replicas\./);
  assert.match(describeDrain({ name: "gpu-01", replicas: [] }), /'llmgw ctl node undrain gpu-01' ends the drain\.$/);
});

test("undrain: ready again, or lost until its agent is back", () => {
  assert.equal(describeUndrain({ name: "gpu-01", state: "ready" }), "Node 'gpu-01' is ready: new replicas may be placed there again.");
  assert.match(describeUndrain({ name: "gpu-01", state: "lost" }), /no longer draining; it is lost now and takes new replicas once its agent is back/);
});

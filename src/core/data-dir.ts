// Names of the files a server keeps in its data dir that other commands on the same
// machine read (`llmgw ctl` finds the server and its admin key through them).
export const ADMIN_KEY_FILE = "admin.key";
export const SERVER_INFO_FILE = "server.json";

#!/usr/bin/env node
// node-opcua server for unskit's tests: the same simulated plant as the asyncua sim, served by an
// OPC UA stack that shares no code with asyncua. Usage:
//     node server.js --port P --pki DIR
// Listens on 127.0.0.1:P only, endpoint opc.tcp://127.0.0.1:P/unskit/, prints READY once it
// accepts connections, and stops on SIGTERM or SIGINT.
"use strict";

const loadStarted = Date.now();
const os = require("node:os");
const path = require("node:path");

// node-opcua looks up this host's fully qualified name at load time (a resolver query that may
// leave the machine); as "localhost" it resolves from /etc/hosts and the certificate names it.
os.hostname = () => "localhost";

const { OPCUAServer } = require("node-opcua-server");
const { OPCUACertificateManager } = require("node-opcua-certificate-manager");
const { SecurityPolicy, MessageSecurityMode } = require("node-opcua-secure-channel");
const { nodesets } = require("node-opcua-nodesets");
const { DataType, Variant, VariantArrayType } = require("node-opcua-variant");
const { StatusCodes } = require("node-opcua-status-code");

const NAMESPACE_URI = "urn:unskit:sim";
const APPLICATION_URI = "urn:unskit:test:node-opcua";
const USERS = { operator: "secret" };
const TICK_MS = 100;

function parseArgs(argv) {
  const args = { port: NaN, pki: "" };
  for (let i = 0; i < argv.length; i += 2) {
    const [key, value] = [argv[i], argv[i + 1]];
    if (key === "--port") args.port = Number(value);
    else if (key === "--pki") args.pki = value || "";
    else throw new Error(`unknown argument ${key}`);
  }
  if (!Number.isInteger(args.port) || args.port <= 0 || args.port > 65535) {
    throw new Error("--port P (1..65535) is required");
  }
  if (!args.pki) throw new Error("--pki DIR (a temporary folder for certificates) is required");
  return args;
}

function buildPlant(addressSpace) {
  const namespace = addressSpace.registerNamespace(NAMESPACE_URI);
  const ns = namespace.index;
  const id = (name) => `ns=${ns};s=${name}`;
  const line = namespace.addFolder(addressSpace.rootFolder.objects, {
    nodeId: id("Line1"),
    browseName: "Line1",
  });
  const variable = (name, dataType, value, extra = {}) =>
    namespace.addVariable({
      componentOf: line,
      nodeId: id(name),
      browseName: name,
      dataType,
      value: new Variant({ dataType: DataType[dataType], value }),
      accessLevel: "CurrentRead",
      userAccessLevel: "CurrentRead",
      ...extra,
    });

  const counter = variable("Counter", "Int32", 0);
  const temperature = namespace.addAnalogDataItem({
    componentOf: line,
    nodeId: id("Temperature"),
    browseName: "Temperature",
    dataType: "Double",
    engineeringUnitsRange: { low: -50, high: 150 },
    value: new Variant({ dataType: DataType.Double, value: 20.0 }),
    accessLevel: "CurrentRead",
    userAccessLevel: "CurrentRead",
  });
  const writable = { accessLevel: "CurrentRead | CurrentWrite", userAccessLevel: "CurrentRead | CurrentWrite" };
  variable("Setpoint", "Double", 21.5, writable);
  variable("Running", "Boolean", true);
  variable("Label", "String", "line one");
  namespace.addVariable({
    componentOf: line,
    nodeId: id("Values"),
    browseName: "Values",
    dataType: "Int32",
    valueRank: 1,
    arrayDimensions: [5],
    value: new Variant({
      dataType: DataType.Int32,
      arrayType: VariantArrayType.Array,
      value: Int32Array.from([1, 2, 3, 4, 5]),
    }),
    accessLevel: "CurrentRead",
    userAccessLevel: "CurrentRead",
  });

  let count = 0;
  const started = Date.now();
  return setInterval(() => {
    count = (count + 1) | 0;
    counter.setValueFromSource(new Variant({ dataType: DataType.Int32, value: count }), StatusCodes.Good);
    const t = (Date.now() - started) / 1000;
    temperature.setValueFromSource(
      new Variant({ dataType: DataType.Double, value: 20 + 5 * Math.sin(t) }),
      StatusCodes.Good,
    );
  }, TICK_MS);
}

async function main() {
  const { port, pki } = parseArgs(process.argv.slice(2));
  const loaded = Date.now();
  const manager = (name, accept) =>
    new OPCUACertificateManager({
      rootFolder: path.join(pki, name),
      automaticallyAcceptUnknownCertificate: accept,
      disableFileWatchers: true,
    });
  const server = new OPCUAServer({
    host: "127.0.0.1", // the listening socket: loopback only
    hostname: "127.0.0.1", // what the endpoint URLs and the certificate name
    port,
    resourcePath: "/unskit/",
    nodesets: [nodesets.standard],
    serverInfo: { applicationUri: APPLICATION_URI, productUri: "unskit-test-node-opcua" },
    buildInfo: { productName: "unskit node-opcua peer" },
    // A test peer trusts every client certificate: the adapter's own trust rules are under test, not these.
    serverCertificateManager: manager("server", true),
    userCertificateManager: manager("user", false),
    securityPolicies: [SecurityPolicy.None, SecurityPolicy.Basic256Sha256],
    securityModes: [MessageSecurityMode.None, MessageSecurityMode.SignAndEncrypt],
    allowAnonymous: true,
    userManager: { isValidUser: (user, password) => Object.hasOwn(USERS, user) && USERS[user] === password },
  });
  await server.initialize();
  const initialized = Date.now();
  const ticker = buildPlant(server.engine.addressSpace);
  await server.start();
  const ms = (a, b) => `${b - a} ms`;
  process.stderr.write(
    `started: load ${ms(loadStarted, loaded)}, initialize ${ms(loaded, initialized)}, ` +
      `listen ${ms(initialized, Date.now())}\n`,
  );
  process.stdout.write(`READY ${server.getEndpointUrl()}\n`);

  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    clearInterval(ticker);
    await server.shutdown(0);
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

main().catch((err) => {
  process.stderr.write(`node-opcua server failed: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});

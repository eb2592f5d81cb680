'use strict';
// The order experiment off the page's thread: attn's own trainer
// (run_order_experiment), once per training length, so that the page can
// draw accuracy against steps (each point a model trained that long, both
// variants from the same seed). Posts {progress} as training goes, {point}
// after each length, then {done} with the longest training's accuracies, or
// {error}.
importScripts('attn_web.js');

const kSteps = [0, 25, 50, 100, 200, 400, 600];

onmessage = ({ data }) => {
  createAttn().then((attn) => {
    const all = kSteps.reduce((sum, steps) => sum + steps, 0);
    let before = 0, result = null;
    for (const steps of kSteps) {
      const report = (done, total) => postMessage({ progress: (before + (done / total) * steps) / all });
      result = JSON.parse(attn.orderExperiment(data.encoding, steps, report));
      if (result.error) break;
      before += steps;
      postMessage({ point: { steps, none: result.none, positions: result.positions } });
    }
    postMessage(result.error ? result : { done: true, none: result.none, positions: result.positions });
  });
};

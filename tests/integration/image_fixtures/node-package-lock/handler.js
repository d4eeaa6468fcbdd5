import isNumber from "is-number";

export function handler(event) {
  console.log(`is-number says ${isNumber(event.value)}`);
}

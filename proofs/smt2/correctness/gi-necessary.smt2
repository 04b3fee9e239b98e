; placement-logic proof obligation: correctness/gi-necessary
; theorem: Correctness
; GI is necessary: SC alone does not give equivalence
;   statement refuted: the plan (DDP whose loss is each device's own token mean (a mean of means)), which satisfies SC, is equivalent to single-device training under one SGD step θ' = θ − ĝ, at sizes dp = 2, microbatches = 2
; the assertions are the NEGATION of the statement:
;   expected sat (witness exists)
(set-logic ALL)
(set-info :status sat)
(declare-fun N_0_0 () Int)
(declare-fun N_0_1 () Int)
(declare-fun N_1_0 () Int)
(declare-fun N_1_1 () Int)
(declare-fun X_1_1 () Real)
(declare-fun X_1_0 () Real)
(declare-fun X_0_1 () Real)
(declare-fun X_0_0 () Real)
(declare-fun theta () Real)
(assert
 (>= N_0_0 1))
(assert
 (>= N_0_1 1))
(assert
 (>= N_1_0 1))
(assert
 (>= N_1_1 1))
(assert
 (<= N_0_0 4))
(assert
 (<= N_0_1 4))
(assert
 (<= N_1_0 4))
(assert
 (<= N_1_1 4))
(assert
 (let ((?x0 (to_real N_1_1)))
(let ((?x1 (to_real N_1_0)))
(let ((?x2 (to_real N_0_1)))
(let ((?x3 (+ (+ 0.0 (to_real N_0_0)) ?x2)))
(let ((?x4 (/ (+ (+ (+ (+ 0.0 X_0_0) X_0_1) X_1_0) X_1_1) (+ (+ ?x3 ?x1) ?x0))))
(let ((?x5 (+ (+ (+ 0.0 (/ X_0_0 ?x3)) (/ X_0_1 ?x3)) (/ X_1_0 (+ (+ 0.0 ?x1) ?x0)))))
(let ((?x6 (- theta (/ (* (+ ?x5 (/ X_1_1 (+ (+ 0.0 ?x1) ?x0))) 1.0) 2.0))))
(let (($x0 (and (distinct ?x6 (- theta ?x4)) true)))
(or $x0 $x0))))))))))
(check-sat)
(exit)
